"""The SL's malloc settings (``daemons/sl/malloc.py``) take where the C library is glibc."""

from __future__ import annotations

import platform

import pytest

from daemons.sl.malloc import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_thresholds() -> None:
    assert keep_freed_memory() is True

"""Small asyncio helpers that keep cancellation reliable on Python 3.11.

Python 3.11's ``asyncio.wait_for`` can swallow a cancellation that arrives just as the awaited thing
completes (fixed in 3.12); a daemon's loop then outlives its shutdown. Our code uses
``asyncio.timeout`` instead, and long-lived loops call ``raise_if_cancelling`` so that a cancellation
swallowed inside a library (aiomqtt uses ``wait_for``) still ends them.
"""

from __future__ import annotations

import asyncio

__all__ = ["raise_if_cancelling"]


def raise_if_cancelling() -> None:
    """Raise CancelledError when the current task has a pending cancellation request."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError

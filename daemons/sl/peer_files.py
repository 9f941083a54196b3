"""A model copied straight out of another SL's buffer file, when both SLs run on this host as one user.

While their ML programs share weights, the SLs' pools keep the rows and merged models in files
(``daemons.sl.buffers``, ``wire.shared``). Between two SLs of one host (one network namespace) under one
user, a data plane transfer names that file instead of sending its bytes through loopback TCP: the
receiver maps the file read-only, copies each chunk into its own buffer and hashes that copy, so what the
peer writes into its file afterwards changes nothing here. For 45 MB that is about 7 ms of CPU against
about 21 ms for the transfer through TCP (both ends) and its hashes.

A peer cannot make this SL read anything else by naming it: only a regular file owned by this process's
user, named like a pool's buffer in an SL's directory, of the size the manifest says, is opened; anything
else is a ``FileRefused`` and the bytes come through the socket instead. ``SWARM_DATAPLANE_FILES=off``
turns the copy off.

The mappings are kept for the next rounds (a pool hands out the same few buffers round after round, and
mapping 45 MB costs 5 ms) up to ``MAPPED_BYTES``; those of files their SL removed are dropped at the next
mapping and when this SL's ML program ends (``forget``), since until then they keep the file's memory.
"""

from __future__ import annotations

import functools
import mmap
import os
import socket
import stat
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from daemons.sl.buffers import FILE_PREFIX
from daemons.sl.workdir import PREFIX as DIRECTORY_PREFIX
from wire.errors import CodecError
from wire.tensors import Manifest, chunk_digest
from wire.workers import run_split, threads_for

__all__ = ["MAPPED_BYTES", "PEER_FILES", "FileRefused", "PeerFiles", "enabled", "local_host"]

MAPPED_BYTES = 2 << 30  # mappings of peers' files kept for the next rounds
_MAX_PATH = 4096


class FileRefused(Exception):
    """A peer's file that is not opened: not one of this user's SL buffers, or gone."""


def enabled() -> bool:
    """``SWARM_DATAPLANE_FILES=off`` sends every model through the socket (on by default)."""
    return os.environ.get("SWARM_DATAPLANE_FILES", "on").strip().lower() not in ("off", "0", "false", "no")


@functools.lru_cache(maxsize=256)
def local_host(host: str) -> bool:
    """Whether ``host`` is an address of this host in this network namespace (we can bind to it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
    except (OSError, UnicodeError, ValueError):
        return False
    return True


def checked_path(text: object) -> str:
    """``text`` as a path a peer may name (a pool's buffer in an SL's directory); CodecError if not."""
    if not isinstance(text, str) or not 0 < len(text) <= _MAX_PATH or "\0" in text:
        raise CodecError(f"data plane: 'file' must be a path of 1..{_MAX_PATH} characters")
    path = Path(text)
    if not path.is_absolute() or not path.name.startswith(FILE_PREFIX):
        raise CodecError(f"data plane: 'file' {text[:200]!r} is not an SL's weight buffer")
    if not path.parent.name.startswith(DIRECTORY_PREFIX) or ".." in path.parts:
        raise CodecError(f"data plane: 'file' {text[:200]!r} is not in an SL's directory")
    return text


@dataclass(frozen=True, slots=True)
class _Mapped:
    fd: int  # kept open: its link count says when the peer removed the file
    view: np.ndarray  # the whole file, read-only


class PeerFiles:
    """Read-only mappings of peers' buffer files, kept for the next rounds up to ``max_bytes``."""

    def __init__(self, max_bytes: int = MAPPED_BYTES) -> None:
        self.max_bytes = max_bytes
        self._mapped: OrderedDict[tuple[int, int], _Mapped] = OrderedDict()
        self._lock = threading.Lock()  # copies run on worker threads

    @property
    def mapped_bytes(self) -> int:
        """Bytes of the files mapped now."""
        with self._lock:
            return sum(m.view.nbytes for m in self._mapped.values())

    def copy_verified(self, path: str, manifest: Manifest, into: np.ndarray) -> None:
        """Copy the file ``path`` into ``into``, hashing each copied chunk against ``manifest``.

        Raises:
            FileRefused: the file is not one we open (the caller asks for the bytes instead).
            CodecError: a copied chunk does not match the manifest.
        """
        source = self._view(path, manifest.total)
        corrupt = _copy_chunks(source, into, manifest)
        if corrupt:
            raise CodecError(f"chunks {corrupt[:10]} of {path} do not match the manifest")

    def forget(self) -> None:
        """Drop every mapping (the files' memory is freed once their SLs removed them)."""
        with self._lock:
            dropped, self._mapped = list(self._mapped.values()), OrderedDict()
        for mapped in dropped:
            os.close(mapped.fd)

    def _view(self, path: str, nbytes: int) -> np.ndarray:
        """The mapping of ``path``, made now or kept from before."""
        fd = _open_checked(path, nbytes)
        info = os.fstat(fd)
        key = (info.st_dev, info.st_ino)
        with self._lock:
            kept = self._mapped.get(key)
            if kept is not None:
                self._mapped.move_to_end(key)
        if kept is not None:
            os.close(fd)
            return kept.view
        try:
            mapping = mmap.mmap(fd, nbytes, prot=mmap.PROT_READ, flags=mmap.MAP_SHARED | _POPULATE)
        except OSError as exc:
            os.close(fd)
            raise FileRefused(f"cannot map {path}: {exc}") from None
        view = np.frombuffer(mapping, dtype=np.uint8)  # the array keeps the mapping
        with self._lock:
            kept = self._mapped.get(key)  # mapped meanwhile by another copy of the same file
            if kept is None:
                self._mapped[key] = _Mapped(fd, view)
            closing = [fd] if kept is not None else self._drop_stale_and_oldest()
        for old in closing:
            os.close(old)
        return view if kept is None else kept.view

    def _drop_stale_and_oldest(self) -> list[int]:
        """Forget the mappings of removed files, then the oldest beyond ``max_bytes``; their fds to close.
        A copy still reading one keeps its mapping alive until it is done."""
        closing: list[int] = []
        for key, mapped in list(self._mapped.items()):
            if os.fstat(mapped.fd).st_nlink == 0:
                closing.append(self._mapped.pop(key).fd)
        total = sum(m.view.nbytes for m in self._mapped.values())
        while total > self.max_bytes and len(self._mapped) > 1:
            _, oldest = self._mapped.popitem(last=False)
            total -= oldest.view.nbytes
            closing.append(oldest.fd)
        return closing


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: the page tables in one go, not a fault per page


def _open_checked(path: str, nbytes: int) -> int:
    """An fd of ``path`` when it is a regular file of ``nbytes`` owned by our user; else FileRefused."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(checked_path(path), flags)
    except (OSError, CodecError) as exc:
        raise FileRefused(f"cannot open {path}: {exc}") from None
    info = os.fstat(fd)
    why = None
    if not stat.S_ISREG(info.st_mode):
        why = "not a regular file"
    elif info.st_uid != os.geteuid():
        why = "owned by another user"
    elif info.st_size != nbytes:
        why = f"{info.st_size} bytes, not {nbytes}"
    if why is not None:
        os.close(fd)
        raise FileRefused(f"{path}: {why}")
    return fd


def _copy_chunks(source: np.ndarray, into: np.ndarray, manifest: Manifest) -> list[int]:
    """Copy ``source`` into ``into`` chunk by chunk, hashing each copy while it is in the cache; the
    indices of the chunks that do not match ``manifest``."""
    size = manifest.chunk_size

    def run(indices: Sequence[int]) -> list[int]:
        corrupt = []
        for index in indices:
            part = slice(index * size, (index + 1) * size)
            np.copyto(into[part], source[part])
            if chunk_digest(into[part].data, manifest.hash) != manifest.chunks[index]:
                corrupt.append(index)
        return corrupt

    return run_split(run, range(manifest.n_chunks), threads_for(manifest.total))


PEER_FILES = PeerFiles()

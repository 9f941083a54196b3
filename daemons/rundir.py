"""Per-node run directories: the container paths of the reference system, emulated with symlinks.

A RUN_SWARM task names container paths (``WorkingDir: /tmp/test``, ``PrivateContent: /tmp/test/``,
``SharedContent: [{Src: ..., Tgt: /tmp/test/model}]``). Here container path ``P`` becomes
``<run_dir>/root/P``. A directory mount becomes a real directory holding one symlink per entry of its
source, so files the program writes at that level stay in this node's run directory (its log beside the
model program, say), while writes into subdirectories reach the source (the node's private scratch).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = ["Mount", "RunDir", "build_run_dir", "parse_mount", "remove_run_dir"]


@dataclass(frozen=True, slots=True)
class Mount:
    """``src`` (a host path) appears at container path ``tgt``."""

    src: Path
    tgt: PurePosixPath


def parse_mount(text: str) -> Mount:
    """``/host/path:/container/path`` (the reference's ``--ml-v``); ValueError when malformed."""
    src, sep, tgt = text.rpartition(":")
    if not sep or not src or not tgt.startswith("/"):
        raise ValueError(f"mount {text!r} must be HOST_PATH:/CONTAINER_PATH")
    return Mount(Path(src).expanduser().resolve(), PurePosixPath(tgt))


@dataclass(frozen=True, slots=True)
class RunDir:
    """A built run directory: where the program runs and how container paths map to it."""

    root: Path
    cwd: Path

    def host_path(self, container_path: str) -> Path:
        """The run-directory path of an absolute container path."""
        return self.root / container_path.lstrip("/")

    def translate_env(self, env: Mapping[str, str], prefixes: Iterable[str]) -> dict[str, str]:
        """Rewrite values that are absolute container paths under ``prefixes`` to run-directory paths."""
        roots = sorted({p.rstrip("/") or "/" for p in prefixes}, key=len, reverse=True)
        out = {}
        for key, value in env.items():
            hit = next((r for r in roots if value == r or value.startswith(r + "/")), None)
            out[key] = str(self.host_path(value)) if hit is not None else value
        return out


def _link_entries(src: Path, dst: Path) -> None:
    """Make ``dst`` a real directory with a symlink to every entry of ``src``."""
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        dst.unlink()
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        link = dst / entry.name
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.is_dir():
            shutil.rmtree(link)
        link.symlink_to(entry)


def _mount(mount: Mount, run: RunDir) -> None:
    if not mount.src.exists():
        raise FileNotFoundError(f"mount source {mount.src} (for {mount.tgt}) does not exist")
    dst = run.host_path(str(mount.tgt))
    dst.parent.mkdir(parents=True, exist_ok=True)
    if mount.src.is_dir():
        _link_entries(mount.src, dst)
        return
    if dst.is_symlink() or dst.is_file():
        dst.unlink()
    dst.symlink_to(mount.src)


def build_run_dir(run_dir: Path, working_dir: str, mounts: Iterable[Mount]) -> RunDir:
    """Create ``run_dir`` with ``working_dir`` and every mount in place (parents before children)."""
    run = RunDir(run_dir.resolve() / "root", Path())
    run.root.mkdir(parents=True, exist_ok=True)
    for mount in sorted(mounts, key=lambda m: len(m.tgt.parts)):
        _mount(mount, run)
    cwd = run.host_path(working_dir)
    cwd.mkdir(parents=True, exist_ok=True)
    return RunDir(run.root, cwd)


def remove_run_dir(run_dir: Path) -> None:
    """Delete a run directory without following its symlinks into the sources."""
    if run_dir.exists():
        shutil.rmtree(run_dir)

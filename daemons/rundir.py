"""Per-node run directories: the container paths of the reference system, emulated with symlinks.

A RUN_SWARM task names container paths (``WorkingDir: /tmp/test``, ``PrivateContent: /tmp/test/``,
``SharedContent: [{Src: ..., Tgt: /tmp/test/model}]``). Here container path ``P`` becomes
``<run_dir>/root/P``. As with a bind mount, everything the program writes under a mount reaches the
source: a directory mount is a symlink to its source; one that other mounts sit inside (``/tmp/test/`` with
``/tmp/test/model``) is a real directory with a symlink per entry of the source, and what the program
creates at its top level is moved into the source when the node ends (:func:`settle`). A missing source is
created, as a bind mount creates it, and said so. Removing a run directory names every file the program
wrote outside its mounts before deleting it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = ["Mount", "RunDir", "build_run_dir", "parse_mount", "remove_run_dir", "settle"]


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
    notes: tuple[str, ...] = ()

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


def _has_nested(mount: Mount, mounts: Iterable[Mount]) -> bool:
    return any(other.tgt != mount.tgt and mount.tgt in other.tgt.parents for other in mounts)


def _mount(mount: Mount, run: RunDir, nested: bool) -> str | None:
    note = None
    if not mount.src.exists():
        mount.src.mkdir(parents=True, exist_ok=True)
        note = f"mount source {mount.src} (for {mount.tgt}) did not exist: created it, as a bind mount does"
    dst = run.host_path(str(mount.tgt))
    dst.parent.mkdir(parents=True, exist_ok=True)
    if mount.src.is_dir() and nested:
        _link_entries(mount.src, dst)
        return note
    if dst.is_symlink() or dst.is_file():
        dst.unlink()
    elif dst.is_dir():
        shutil.rmtree(dst)
    dst.symlink_to(mount.src, target_is_directory=mount.src.is_dir())
    return note


def build_run_dir(run_dir: Path, working_dir: str, mounts: Iterable[Mount]) -> RunDir:
    """Create ``run_dir`` with ``working_dir`` and every mount in place (parents before children)."""
    run = RunDir(run_dir.resolve() / "root", Path())
    run.root.mkdir(parents=True, exist_ok=True)
    ordered = sorted(mounts, key=lambda m: len(m.tgt.parts))
    notes = [_mount(m, run, _has_nested(m, ordered)) for m in ordered]
    cwd = run.host_path(working_dir)
    cwd.mkdir(parents=True, exist_ok=True)
    return RunDir(run.root, cwd, tuple(note for note in notes if note))


def settle(run_dir: Path, mounts: Iterable[Mount]) -> list[str]:
    """Move what the program created at the top level of a mount with mounts inside into its source.

    A bind mount would have put it there; a name the source has already is left where it is (and said
    so). Returns one line per entry moved or left.
    """
    root = run_dir.resolve() / "root"
    mounts = list(mounts)
    lines = []
    for mount in mounts:
        dst = root / str(mount.tgt).lstrip("/")
        if not _has_nested(mount, mounts) or not dst.is_dir() or dst.is_symlink():
            continue
        inner = {m.tgt.name for m in mounts if m.tgt.parent == mount.tgt}
        for entry in sorted(dst.iterdir()):
            if entry.is_symlink() or entry.name in inner:
                continue
            target = mount.src / entry.name
            if target.exists():
                lines.append(f"{entry} was written beside {target}, which exists: left in {run_dir}")
                continue
            shutil.move(str(entry), str(target))
            lines.append(f"moved {entry.name}, written at {mount.tgt}, to {target} (as a bind mount would)")
    return lines


def user_files(run_dir: Path) -> list[Path]:
    """Files the program wrote inside a run directory's container paths (outside every mount)."""
    root = run_dir / "root"
    if not root.is_dir():
        return []
    found = []
    for folder, _dirs, files in os.walk(root):  # does not follow symlinked directories
        found += [Path(folder) / f for f in files if not (Path(folder) / f).is_symlink()]
    return found


def remove_run_dir(run_dir: Path) -> list[Path]:
    """Delete a run directory without following its symlinks into the sources.

    Returns the files the program had written outside its mounts (deleted with it), for the caller to name.
    """
    if not run_dir.exists():
        return []
    written = user_files(run_dir)
    shutil.rmtree(run_dir)
    return written

"""The tasks that prepare what RUN_SWARM needs: user environments, content, images.

MAKE_USER_ENV builds a Python virtual environment from a requirements list. MAKE_USER_CONTAINER, on a
host without a container engine, builds the same kind of environment from the ``pip install`` steps of
its Dockerfile and reports the other steps as skipped; its ``FROM`` of a well-known image installs the
Python packages that image carries (``pytorch/pytorch``: torchvision, torchaudio) in the versions that
match the installed torch, checks that they import, and reports those that do not. The environment sees
this installation's packages (torch, numpy, swarmlearning) through a ``.pth`` file, so only what is
missing is installed, and pip is always constrained to the installed torch: it never replaces it. Where
every requirement is a plain named one that those packages meet already, pip is not run at all (it took
1.2-2 s to find that out, of a 30 s demo).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import re
import shutil
import site
import sys
import tarfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from taskdefs import (
    MakeSwarmUserContentBody,
    MakeUserContainerBody,
    MakeUserEnvBody,
    PullImageBody,
    TaskBody,
    container_build_plan,
)

__all__ = ["BuildResult", "env_python", "missing_requirements", "run_build"]


@dataclass(frozen=True)
class BuildResult:
    """How a preparation task went: ``ok`` and a description for GET TASKRUNNER PEER STATUS."""

    ok: bool
    description: str


def env_python(envs: Path, outcome: str) -> Path | None:
    """The interpreter of the environment built for ``outcome``, if it exists."""
    python = envs / outcome / "bin" / "python"
    return python if python.exists() else None


async def _run(argv: list[str], log_path: Path, cwd: Path | None = None) -> tuple[int, str]:
    with log_path.open("a") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=log, stderr=asyncio.subprocess.STDOUT, cwd=cwd
        )
        code = await proc.wait()
    return code, await asyncio.to_thread(_tail, log_path)


def _tail(path: Path, lines: int = 8) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def installed_torch() -> str | None:
    """The version of the torch this installation has (``2.13.0``, local label dropped), or None."""
    try:
        return importlib.metadata.version("torch").split("+", 1)[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def image_requirements(packages: tuple[str, ...], torch: str | None) -> tuple[list[str], list[str]]:
    """Requirements for the packages an image carries, matched to ``torch``; and notes for the user.

    torchvision 0.(m+15) and torchaudio 2.m go with torch 2.m; torch itself is never installed here
    (pip would take a CUDA build of several GB): it must be installed with the project.
    """
    match = re.match(r"^2\.(\d+)", torch or "")
    requirements, notes = [], []
    for package in packages:
        if package == "torch":
            if torch is None:
                notes.append("the image carries torch, which is not installed here: install torch first")
        elif package in ("torchvision", "torchaudio") and match is None:
            notes.append(f"{package} left out: its version follows torch 2.x, and torch here is {torch}")
        elif package == "torchvision":
            requirements.append(f"torchvision=={int(match.group(1)) + 15 if match else 0}.*")
        elif package == "torchaudio":
            requirements.append(f"torchaudio==2.{match.group(1) if match else 0}.*")
        else:
            requirements.append(package)
    return requirements, notes


async def _check_imports(env_dir: Path, packages: list[str], log_path: Path) -> list[str]:
    """Import every package in the environment; uninstall and name those that fail."""
    python = str(env_dir / "bin" / "python")
    notes = []
    for requirement in packages:
        name = Requirement(requirement).name  # the image's own packages: named, and imported by that name
        code, tail = await _run([python, "-c", f"import {name.replace('-', '_')}"], log_path)
        if code == 0:
            continue
        await _run([sys.executable, "-m", "pip", "--python", python, "uninstall", "-y", "-q", name], log_path)
        reason = tail.strip().splitlines()[-1] if tail.strip() else f"exit {code}"
        notes.append(
            f"{name} from PyPI does not import beside torch {installed_torch()} here ({reason}): left out; "
            "a CPU-only torch needs it from the PyTorch CPU index (pip --extra-index-url "
            "https://download.pytorch.org/whl/cpu), a CUDA torch gets it from PyPI"
        )
    return notes


def _base_paths() -> list[str]:
    """Where a new environment finds this installation's packages (``_link_base_packages``)."""
    project = Path(__file__).resolve().parents[2]
    return [*(p for p in site.getsitepackages() if Path(p).is_dir()), str(project)]


def _satisfied(requirement: str, paths: list[str]) -> bool:
    """Whether ``requirement`` is a named requirement (PEP 508) that a distribution in ``paths`` meets.
    Whatever else pip may be given (an option, a file, a URL, extras) counts as not met: pip decides.
    The distribution's own dependencies are taken as met: pip installed them with it."""
    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return False
    if req.url or req.extras:
        return False
    if req.marker is not None and not req.marker.evaluate():
        return True  # not for this platform: pip would skip it too
    found = next(iter(importlib.metadata.distributions(name=req.name, path=paths)), None)
    return found is not None and req.specifier.contains(found.version, prereleases=True)


def _names_something(line: str) -> bool:
    """Whether a line of requirements (``container_build_plan``'s) names what to install: a requirement, a
    path, a URL, ``-r file``, ``-e path``; not an option such as ``--index-url URL`` or ``--pre``."""
    word = line.split(maxsplit=1)[0] if line.strip() else ""
    return not word.startswith("-") or word in ("-r", "-e")


def missing_requirements(requirements: list[str]) -> list[str]:
    """What pip still has to see of ``requirements``: those a new environment on top of this installation
    does not meet already, with the options among them; nothing when no line left names something to
    install (pip refuses options alone)."""
    paths = _base_paths()
    missing = [r for r in requirements if not _satisfied(r, paths)]
    return missing if any(_names_something(r) for r in missing) else []


def _note_installed(requirements: list[str], log_path: Path) -> None:
    """Say in the build's log which requirements pip is not run for (a line, as ``_run`` writes its own)."""
    with log_path.open("a") as log:
        log.write(f"# installed already, pip not run for: {' '.join(requirements)}\n")


def _constraints(env_dir: Path) -> list[str]:
    """``-c file`` pinning the installed torch, so that pip never replaces it."""
    torch = installed_torch()
    if torch is None:
        return []
    path = env_dir / "constraints.txt"
    path.write_text(f"torch=={torch}\n")
    return ["-c", str(path)]


async def build_env(
    env_dir: Path,
    requirements: list[str],
    log_path: Path,
    cwd: Path | None = None,
    *,
    check: tuple[str, ...] = (),
) -> BuildResult:
    """Create ``env_dir`` (a venv on top of this installation) and pip-install those ``requirements`` that
    this installation does not meet already (``missing_requirements``).

    ``check``: requirements whose packages must import afterwards (those that do not are removed and
    named in the description).
    """
    await asyncio.to_thread(_fresh_dir, env_dir)
    code, tail = await _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], log_path)
    if code != 0:
        return BuildResult(False, f"creating the environment failed (exit {code}):\n{tail}")
    await asyncio.to_thread(_link_base_packages, env_dir)
    notes: list[str] = []
    pip = [sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install",
           "--disable-pip-version-check", "-q", *_constraints(env_dir)]  # fmt: skip
    missing = await asyncio.to_thread(missing_requirements, requirements)
    met = [r for r in requirements if r not in missing and _names_something(r)]  # not the options
    if met:
        _note_installed(met, log_path)
    for requirement in (r for r in check if r in missing):  # one at a time: a missing release is a note
        code, tail = await _run([*pip, requirement], log_path, cwd)
        if code != 0:
            last = tail.strip().splitlines()[-1] if tail.strip() else f"exit {code}"
            notes.append(f"{requirement} (from the base image) left out: {last}")
    rest = [r for r in missing if r not in check]
    if rest:
        code, tail = await _run([*pip, *rest], log_path, cwd)
        if code != 0:
            return BuildResult(False, f"pip install failed (exit {code}):\n{tail}")
    installed = [r for r in check if not any(n.startswith(f"{r} ") for n in notes)]
    notes += await _check_imports(env_dir, installed, log_path)
    extra = "".join(f"\n{note}" for note in notes)
    return BuildResult(True, f"environment {env_dir.name} ready ({len(requirements)} requirements){extra}")


def _fresh_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)


def _link_base_packages(env_dir: Path) -> None:
    """Make this installation's packages importable in the new environment."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    target = env_dir / "lib" / version / "site-packages"
    target.mkdir(parents=True, exist_ok=True)
    (target / "_open_swarm_base.pth").write_text("\n".join(_base_paths()) + "\n")


async def run_build(
    body: TaskBody, *, outcome: str, envs: Path, content: Path, log_path: Path
) -> BuildResult:
    """Run one preparation task's body."""
    if isinstance(body, MakeUserEnvBody):
        cwd = Path(body.build_context) if body.build_context else None
        return await build_env(envs / outcome, list(body.requirements), log_path, cwd)
    if isinstance(body, MakeUserContainerBody):
        plan = container_build_plan(body)
        from_image, notes = image_requirements(plan.image_packages, installed_torch())
        requirements = [*from_image, *(r for r in plan.requirements if r not in from_image)]
        result = await build_env(envs / outcome, requirements, log_path, check=tuple(from_image))
        skipped = "; ".join(f"{step.strip()[:40]} ({why})" for step, why in plan.skipped)
        added = ", ".join(from_image) or "nothing to add"
        image = f"; base image {plan.image}: {added}" if plan.image else ""
        lines = [f"{result.description}{image}; no container engine, skipped: {skipped}", *notes]
        return BuildResult(result.ok, "\n".join(lines))
    if isinstance(body, PullImageBody):
        return BuildResult(
            True, "no container engine here: nothing to pull; RUN_SWARM uses Python environments"
        )
    if isinstance(body, MakeSwarmUserContentBody):
        return await asyncio.to_thread(_make_content, body, content / outcome)
    return BuildResult(False, f"this SWOP cannot run a {type(body).__name__}")


def _make_content(body: MakeSwarmUserContentBody, target: Path) -> BuildResult:
    target.mkdir(parents=True, exist_ok=True)
    for op in body.ops_list:
        for option in op.options or []:
            out = target / option.out
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                if op.operation == "DOWNLOAD":
                    with urllib.request.urlopen(op.target, timeout=60) as response, out.open("wb") as f:  # noqa: S310
                        shutil.copyfileobj(response, f)
                else:
                    _extract(Path(op.target) if Path(op.target).is_absolute() else target / op.target, out)
            except (OSError, ValueError, tarfile.TarError, zipfile.BadZipFile) as exc:
                return BuildResult(False, f"{op.operation} {op.target}: {exc}")
    return BuildResult(True, f"content in {target}")


def _extract(archive: Path, out: Path) -> None:
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            z.extractall(out)  # noqa: S202 - the user's own content task
    else:
        with tarfile.open(archive) as t:
            t.extractall(out, filter="data")

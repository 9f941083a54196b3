"""The tasks that prepare what RUN_SWARM needs: user environments, content, images.

MAKE_USER_ENV builds a Python virtual environment from a requirements list. MAKE_USER_CONTAINER, on a
host without a container engine, builds the same kind of environment from the ``pip install`` steps of
its Dockerfile and reports the other steps as skipped. The environment sees this installation's
packages (torch, numpy, swarmlearning) through a ``.pth`` file, so only what is missing is installed.
"""

from __future__ import annotations

import asyncio
import shutil
import site
import sys
import tarfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from taskdefs import (
    MakeSwarmUserContentBody,
    MakeUserContainerBody,
    MakeUserEnvBody,
    PullImageBody,
    TaskBody,
    container_build_plan,
)

__all__ = ["BuildResult", "env_python", "run_build"]


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


async def build_env(
    env_dir: Path, requirements: list[str], log_path: Path, cwd: Path | None = None
) -> BuildResult:
    """Create ``env_dir`` (a venv on top of this installation) and pip-install ``requirements``."""
    await asyncio.to_thread(_fresh_dir, env_dir)
    code, tail = await _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], log_path)
    if code != 0:
        return BuildResult(False, f"creating the environment failed (exit {code}):\n{tail}")
    await asyncio.to_thread(_link_base_packages, env_dir)
    if requirements:
        argv = [sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install",
                "--disable-pip-version-check", "-q", *requirements]  # fmt: skip
        code, tail = await _run(argv, log_path, cwd)
        if code != 0:
            return BuildResult(False, f"pip install failed (exit {code}):\n{tail}")
    return BuildResult(True, f"environment {env_dir.name} ready ({len(requirements)} requirements)")


def _fresh_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)


def _link_base_packages(env_dir: Path) -> None:
    """Make this installation's packages importable in the new environment."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    target = env_dir / "lib" / version / "site-packages"
    target.mkdir(parents=True, exist_ok=True)
    paths = [p for p in site.getsitepackages() if Path(p).is_dir()]
    project = Path(__file__).resolve().parents[2]
    (target / "_open_swarm_base.pth").write_text("\n".join([*paths, str(project)]) + "\n")


async def run_build(
    body: TaskBody, *, outcome: str, envs: Path, content: Path, log_path: Path
) -> BuildResult:
    """Run one preparation task's body."""
    if isinstance(body, MakeUserEnvBody):
        cwd = Path(body.build_context) if body.build_context else None
        return await build_env(envs / outcome, list(body.requirements), log_path, cwd)
    if isinstance(body, MakeUserContainerBody):
        plan = container_build_plan(body)
        result = await build_env(envs / outcome, plan.requirements, log_path)
        skipped = "; ".join(f"{step.strip()[:40]} ({why})" for step, why in plan.skipped)
        return BuildResult(result.ok, f"{result.description}; no container engine, skipped: {skipped}")
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

"""MAKE_USER_ENV on top of this installation: pip runs only for what the installation does not meet."""

from __future__ import annotations

import importlib.metadata
import subprocess
from pathlib import Path

import numpy as np

from daemons.swop.builds import build_env, missing_requirements

TORCH = importlib.metadata.version("torch").split("+", 1)[0]


def test_named_requirements_the_installation_meets_are_not_missing() -> None:
    met = [
        "numpy",
        f"numpy=={np.__version__}",
        "NumPy>=1",  # names compare normalised
        "scikit_learn",
        'numpy; python_version < "3"',  # a marker that does not apply: pip would skip it too
        f"torch=={TORCH}",  # a public version matches the installed one whatever its local label (+cpu)
    ]
    assert missing_requirements(met) == []


def test_anything_else_is_left_to_pip() -> None:
    others = [
        "numpy<1",  # installed, in another version
        "no-such-package-for-open-swarm",
        "numpy[dev]",  # extras: their own requirements
        "./a/local/path",
        "-r requirements.txt",
        "pip @ https://example.invalid/pip.whl",
        "numpy>=",  # not a requirement at all: pip says why
    ]
    assert missing_requirements(others) == others


def test_pip_options_go_with_what_is_missing_and_alone_need_no_pip() -> None:
    index = "--index-url https://example.invalid/simple"
    assert missing_requirements([index, "numpy", "--pre"]) == []  # pip would refuse options alone
    assert missing_requirements([index, "numpy", "no-such-package-for-open-swarm"]) == [
        index,
        "no-such-package-for-open-swarm",
    ]
    assert missing_requirements(["--pre", "-r requirements.txt"]) == ["--pre", "-r requirements.txt"]


async def test_an_environment_of_installed_requirements_is_ready_without_pip(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    result = await build_env(tmp_path / "env", ["numpy", "torch"], log)
    assert result.ok, result.description
    assert "-m pip" not in log.read_text()
    assert "# installed already, pip not run for: numpy torch" in log.read_text()


async def test_the_log_names_only_the_requirements_it_did_not_install(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    result = await build_env(tmp_path / "env", ["--pre", "numpy"], log)
    assert result.ok, result.description
    assert "-m pip" not in log.read_text()
    assert "# installed already, pip not run for: numpy\n" in log.read_text()
    python = tmp_path / "env" / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", "import numpy, torch"], check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


async def test_a_requirement_it_does_not_meet_goes_to_pip_alone(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    result = await build_env(tmp_path / "env", ["numpy", str(tmp_path / "no-such-project")], log)
    assert not result.ok and "pip install failed" in result.description
    pip_lines = [line for line in log.read_text().splitlines() if "-m pip" in line]
    assert len(pip_lines) == 1 and pip_lines[0].endswith(str(tmp_path / "no-such-project")), pip_lines

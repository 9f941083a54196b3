"""The README's "Using it" recipe, run from the README's own text, so that it cannot drift.

The block runs as one bash script at the repository's root, as a newcomer pastes it. Two things are
changed, and only these: its ``runs/`` folder becomes ``runs/test-readme/`` (so a user's own
``runs/certs`` is never touched) and its port 30304 a free one (tests run side by side).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from daemons.broker import free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def recipe() -> str:
    """The first ``bash`` block of the README's "Using it" section."""
    text = README.read_text()
    section = text.split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```bash\n(.*?)```", section, re.S)
    assert found, "the README's Using it section has no ```bash block"
    return found.group(1)


def test_the_recipe_names_real_files() -> None:
    script = recipe()
    assert "source .venv/bin/activate" in script and "swarm certs init --dir runs/certs" in script
    for path in re.findall(r"examples/[\w./-]+", script):
        assert (ROOT / path).exists(), path
    assert "runs/" in (ROOT / ".gitignore").read_text().replace("/runs/", "runs/")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_using_it_recipe_trains_a_model_with_certificates() -> None:
    work = "runs/test-readme/"
    shutil.rmtree(ROOT / work, ignore_errors=True)
    script = recipe().replace("runs/", work).replace("30304", str(free_port()))
    (ROOT / work).mkdir(parents=True)
    proc = subprocess.Popen(
        ["bash", "-e", "-c", script],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "COLUMNS": "120", "SWCI_WAIT_INTERVAL": "0.5"},
    )
    try:
        output, _ = proc.communicate(timeout=540)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    logs = "".join(
        f"\n--- {path.name}\n{path.read_text(errors='replace')[-2000:]}"
        for path in (ROOT / work).glob("*.log")
    )
    assert proc.returncode == 0, output[-6000:] + logs
    results = [
        json.loads(p.read_text())
        for p in (ROOT / work).glob("mnist/user*/data-and-scratch/scratch/result.json")
    ]
    assert len(results) == 4, output[-4000:]
    assert len({r["digest"] for r in results}) == 1
    assert all(r["accuracy"] > 0.5 for r in results)
    assert "Task run_mnist_pyt on taskrunner" in output and "is COMPLETE" in output
    assert (ROOT / work / "history.csv").read_text().count("\n") > 10
    assert (ROOT / work / "plots" / "defaultbb.cqdb.sml.hpe.png").exists()
    assert "-cert.pem" in (ROOT / work / "mnist" / "swop" / "swop_profile.yaml").read_text()
    shutil.rmtree(ROOT / work, ignore_errors=True)

"""A complete swci-init script in the reference system's format, run end to end against a real SN.

``swci --usr-dir <dir> --init-script-name swci-init`` as the reference's ``run-swci`` starts it: the
script ``cd``s to ``/platform/swarm/usr`` (the usr dir) and uses paths relative to it. The second
test assigns the task to a real ``swarm swop`` and waits for it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RunningSN

pytestmark = pytest.mark.timeout(60)
needs_swop = pytest.mark.skipif(importlib.util.find_spec("daemons.swop") is None, reason="needs swarm swop")

ROOT = Path(__file__).parents[1]
TASKRUNNER = "defaulttaskbb.taskdb.sml.hpe"

PULL_TASK = """\
######################################################################
# Pull the user image (a no-op on a host without a container engine)
######################################################################
Name: pull_user_image
TaskType: PULL_IMAGE
Author: swarm-tester
Prereq: ROOTTASK
Outcome: user-image
Body:
    Tag: latest
    RepoName: user-env-pyt
    OrgAndReg: registry.example.org/swarm
    Auth: ~
"""

SWOP_PROFILE = """\
groupname: demo
taskrunner: defaulttaskbb.taskdb.sml.hpe
policyuri: ~
resourcemgr:
    mgrtype: DOCKER
    accessinfo:
      accesstype: FROMENV
network: host-1-net
apls:
  locator:
    host: 127.0.0.1
    port: ~
apisrv:
  locator:
    host: 127.0.0.1
    port: {port}
    service: ~
envvars: ~
nodes:
  - slnodedef:
      idx: 0
      identity: []
      slhostname: sl1
      usrhostname: user1
      privatedata: ~
      slenvvars: ~
      usrenvvars: ~
"""


def _init_script(sn: RunningSN, middle: str) -> str:
    return f"""\
######################################################################
# swci-init of the integration test (the reference example's layout)
######################################################################
EXIT ON FAILURE
wait for ip 127.0.0.1 {sn.port}
create context test-pull with ip 127.0.0.1 {sn.port}
switch context test-pull
EXIT ON FAILURE OFF

cd /platform/swarm/usr

EXIT ON FAILURE
create task from taskdefs/pull_user_image.yaml
finalize task pull_user_image
get task info pull_user_image
get task body pull_user_image
list tasks
EXIT ON FAILURE OFF
{middle}
EXIT ON FAILURE
LIST CONTRACTS
RESET CONTRACT defaultbb.cqdb.sml.hpe
EXIT ON FAILURE OFF
EXIT
"""


def _usr_dir(tmp_path: Path, script: str) -> Path:
    usr = tmp_path / "usr"
    (usr / "taskdefs").mkdir(parents=True)
    (usr / "taskdefs" / "pull_user_image.yaml").write_text(PULL_TASK)
    (usr / "swci-init").write_text(script)
    return usr


def _run_swci(usr: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "swci.main", "--usr-dir", str(usr), "--init-script-name", "swci-init"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        # COLUMNS: tables unwrapped, whatever the terminal (an xdist worker gets 80)
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
        timeout=45,
        check=False,
    )


def _after(lines: list[str], command: str) -> list[str]:
    """The lines printed after the echo of ``command`` (up to the next echo)."""
    start = next(
        i for i, line in enumerate(lines) if line.startswith("SWCI:") and line.endswith(f"> {command}")
    )
    rest = lines[start + 1 :]
    end = next((i for i, line in enumerate(rest) if line.startswith("SWCI:")), len(rest))
    return rest[:end]


def test_init_script_end_to_end(sn: RunningSN, tmp_path: Path) -> None:
    middle = f"""
EXIT ON FAILURE
create taskrunner custom.taskdb
get taskrunner status {TASKRUNNER}
list taskrunners
EXIT ON FAILURE OFF
"""
    usr = _usr_dir(tmp_path, _init_script(sn, middle))
    done = _run_swci(usr, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "SWCI:0 > EXIT ON FAILURE"
    assert _after(lines, f"wait for ip 127.0.0.1 {sn.port}") == [
        f"Swarm Network node sn-1 is up at mqtt://127.0.0.1:{sn.port}"
    ]
    assert _after(lines, "create task from taskdefs/pull_user_image.yaml") == [
        "Task definition is valid",
        "Task Registered : pull_user_image",
    ]
    assert any(
        "FINALIZED" in line and "yes" in line for line in _after(lines, "get task info pull_user_image")
    )
    assert _after(lines, "get task body pull_user_image")[:2] == ["Tag: latest", "RepoName: user-env-pyt"]
    assert any("pull_user_image" in line and "PULL_IMAGE" in line for line in _after(lines, "list tasks"))
    assert "TASK_STATE : IDLE" in _after(lines, f"get taskrunner status {TASKRUNNER}")
    assert any("custom.taskdb" in line for line in _after(lines, "list taskrunners"))
    assert any("defaultbb.cqdb.sml.hpe" in line for line in _after(lines, "LIST CONTRACTS"))
    assert _after(lines, "RESET CONTRACT defaultbb.cqdb.sml.hpe") == ["Contract defaultbb.cqdb.sml.hpe reset"]
    assert lines[-1].endswith("> EXIT")
    assert "Traceback" not in done.stdout + done.stderr


def test_a_failing_init_script_exits_with_failure(sn: RunningSN, tmp_path: Path) -> None:
    middle = "EXIT ON FAILURE\nassign task pull_user_image to defaulttaskbb.taskdb.sml.hpe with 2 peers\n"
    usr = _usr_dir(tmp_path, _init_script(sn, middle))
    done = _run_swci(usr, tmp_path)
    assert done.returncode == 1
    reason = f"no online SWOP is enrolled on taskrunner '{TASKRUNNER}'; start a SWOP for it first"
    assert _after(done.stdout.splitlines(), f"assign task pull_user_image to {TASKRUNNER} with 2 peers") == [
        reason,
        "EXIT ON FAILURE is ON: ending the session",
    ]
    assert "LIST CONTRACTS" not in done.stdout


@pytest.fixture
def swop(sn: RunningSN, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``swarm swop`` for the SN, enrolled on the default taskrunner."""
    profile = tmp_path / "swop" / "swop_profile.yaml"
    profile.parent.mkdir()
    profile.write_text(SWOP_PROFILE.format(port=sn.port))
    out = tmp_path / "swop" / "swop.out"
    argv = [sys.executable, "-m", "daemons.cli", "swop", "--profile", str(profile), "--uid", "swop-1",
            "--sn-api-port", str(sn.port), "--work-dir", str(tmp_path / "swop" / "work")]  # fmt: skip
    with out.open("wb") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 30
        while "listening on taskrunner" not in out.read_text(errors="replace"):
            assert process.poll() is None and time.monotonic() < deadline, out.read_text(errors="replace")
            time.sleep(0.05)
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(20)


@needs_swop
def test_init_script_assigns_to_a_swop_and_waits(
    sn: RunningSN, swop: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    middle = f"""
EXIT ON FAILURE
RESET TASKRUNNER {TASKRUNNER}
ASSIGN TASK pull_user_image TO {TASKRUNNER} WITH 1 PEERS
WAIT FOR TASKRUNNER {TASKRUNNER}
GET TASKRUNNER STATUS {TASKRUNNER}
GET TASKRUNNER PEER STATUS {TASKRUNNER} 0
RESET TASKRUNNER {TASKRUNNER}
EXIT ON FAILURE OFF
"""
    usr = _usr_dir(tmp_path, _init_script(sn, middle))
    done = _run_swci(usr, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert _after(lines, f"ASSIGN TASK pull_user_image TO {TASKRUNNER} WITH 1 PEERS") == [
        f"Task pull_user_image assigned to taskrunner {TASKRUNNER} WITH 1 PEERS",
        "Allocation : swop-1: 1",
    ]
    waited = _after(lines, f"WAIT FOR TASKRUNNER {TASKRUNNER}")
    assert (
        waited[-1] == f"Task pull_user_image on taskrunner {TASKRUNNER} is COMPLETE (1 of 1 peers completed)"
    )
    assert "TASK_STATE : COMPLETE" in _after(lines, f"GET TASKRUNNER STATUS {TASKRUNNER}")
    assert "SWOP UID : swop-1" in _after(lines, f"GET TASKRUNNER PEER STATUS {TASKRUNNER} 0")

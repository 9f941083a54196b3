"""``swci`` as a user runs it: ``python -m swci.main`` subprocesses against a real SN.

Each run inherits the test's isolated ``XDG_CONFIG_HOME``/``XDG_STATE_HOME`` (see conftest), so
contexts created by one run are there for the next, as for a user.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from certs import init_swarm
from daemons.broker import free_port
from swci.paths import log_file
from tests.conftest import RunningSN, start_sn

pytestmark = pytest.mark.timeout(60)

DEFAULT_CONTRACT = "defaultbb.cqdb.sml.hpe"


def swci(
    *args: str, stdin: str | None = None, cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``swci`` with ``args``; stdin is the given text, or empty (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "swci.main", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        cwd=cwd or Path(__file__).parents[1],
        env={**os.environ, **env},
        timeout=45,
        check=False,
    )


def _context(sn: RunningSN) -> list[str]:
    return ["-e", f"CREATE CONTEXT test WITH IP 127.0.0.1 {sn.port}", "-e", "SWITCH CONTEXT test"]


def test_execute_mode_exit_status(sn: RunningSN) -> None:
    done = swci(*_context(sn), "-e", "CREATE CONTRACT mnist", "-e", "LIST CONTRACTS")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contract mnist created" in done.stdout
    assert DEFAULT_CONTRACT in done.stdout
    failed = swci("-e", "GET CONTRACT INFO nothing", "-e", "LIST TASKS")
    assert failed.returncode == 1
    assert "no contract 'nothing' (LIST CONTRACTS shows them)" in failed.stdout
    assert "ROOTTASK" in failed.stdout  # a failure does not stop -e without EXIT ON FAILURE
    assert "Traceback" not in failed.stdout + failed.stderr
    stopped = swci("-e", "EXIT ON FAILURE", "-e", "GET TASK INFO nothing", "-e", "LIST TASKS")
    assert stopped.returncode == 1
    assert "ROOTTASK" not in stopped.stdout


def test_json_format(sn: RunningSN) -> None:
    swci(*_context(sn))
    done = swci(
        "--format", "json", "-e", "LIST TASKS", "-e", "GET TASKRUNNER STATUS defaulttaskbb.taskdb.sml.hpe"
    )
    assert done.returncode == 0, done.stdout
    tasks, status = (json.loads(line) for line in done.stdout.splitlines())
    assert (tasks["command"], tasks["ok"]) == ("LIST TASKS", True)
    assert [task["name"] for task in tasks["data"]] == ["ROOTTASK"]
    assert status["data"]["state"] == "IDLE"
    assert status["messages"] == ["TASK_STATE : IDLE"]
    failed = swci("--format", "json", "-e", "GET CONTRACT INFO nothing")
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["messages"] == ["no contract 'nothing' (LIST CONTRACTS shows them)"]


def test_a_script_on_stdin_stops_at_the_first_failure_under_exit_on_failure(sn: RunningSN) -> None:
    script = f"""\
# a comment, then a blank line

CREATE CONTEXT test WITH IP 127.0.0.1 {sn.port}
SWITCH CONTEXT test
EXIT ON FAILURE
CREATE CONTRACT first
GET CONTRACT INFO second
CREATE CONTRACT never
EXIT
"""
    done = swci(stdin=script)
    assert done.returncode == 1, done.stdout
    lines = done.stdout.splitlines()
    assert "SWCI:0 > CREATE CONTEXT test WITH IP 127.0.0.1" in lines[0]  # echoed as the reference does
    assert "SWCI:4 > GET CONTRACT INFO second" in lines
    assert "no contract 'second' (LIST CONTRACTS shows them)" in lines
    assert "EXIT ON FAILURE is ON: ending the session" in lines
    assert "never" not in done.stdout
    listed = swci("--format", "json", "-e", "LIST CONTRACTS")
    assert [c["name"] for c in json.loads(listed.stdout)["data"]] == [DEFAULT_CONTRACT, "first"]


def test_a_script_that_ends_with_exit_succeeds(sn: RunningSN) -> None:
    script = f"CREATE CONTEXT test WITH IP 127.0.0.1 {sn.port}\nSWITCH CONTEXT test\nLIST NODES\nEXIT\n"
    done = swci(stdin=script)
    assert done.returncode == 0, done.stdout
    assert "NODE TYPE, HOST IP, PORT, CONTAINER NAME, UUID, PARENT UUID, I-AM-ALIVE" in done.stdout
    assert f"SENTINEL, 127.0.0.1, {sn.port}, sn-1, sn-1, ," in done.stdout


def test_a_syntax_error_in_a_script_names_the_file_and_line(tmp_path: Path) -> None:
    script = tmp_path / "setup.swci"
    script.write_text("EXIT ON FAILURE\nASSIGN TASK t INTO tr WITH 2 PEERS\nLIST CONTEXTS\n")
    done = swci("--init-script", str(script))
    assert done.returncode == 1
    assert f"{script}: line 2, col 15: expected TO after" in done.stdout
    assert "INTO" in done.stdout
    assert "LIST CONTEXTS" not in done.stdout


def test_wait_for_ip_with_nothing_there_fails_cleanly() -> None:
    port = free_port()
    started = time.monotonic()
    done = swci("-e", f"WAIT FOR IP 127.0.0.1 {port} 2", SWCI_WAIT_INTERVAL="0.2")
    assert done.returncode == 1
    assert f"no Swarm Network node answered at mqtt://127.0.0.1:{port} after 3 attempt(s)" in done.stdout
    assert "connection refused" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert time.monotonic() - started < 20


def test_wait_for_ip_finds_the_sn(sn: RunningSN) -> None:
    done = swci("-e", f"WAIT FOR IP 127.0.0.1 {sn.port} 3")
    assert done.returncode == 0, done.stdout
    assert f"Swarm Network node sn-1 is up at mqtt://127.0.0.1:{sn.port}" in done.stdout


def test_usr_dir_maps_the_reference_path(tmp_path: Path) -> None:
    (tmp_path / "taskdefs").mkdir()
    done = swci("--usr-dir", str(tmp_path), "-e", "CD /platform/swarm/usr/taskdefs", "-e", "PWD")
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip() == str(tmp_path.resolve() / "taskdefs")


def test_bad_options_and_the_version() -> None:
    assert swci("--version").stdout.startswith("swci (open Swarm Learning) ")
    unknown = swci("--context", "nowhere", "-e", "LIST CONTEXTS")
    assert unknown.returncode == 2
    assert "no context 'nowhere'" in unknown.stdout
    no_dir = swci("--usr-dir", "/nonexistent/usr", "-e", "PWD")
    assert (no_dir.returncode, "not a directory" in no_dir.stdout) == (2, True)
    half_identity = swci("--cert", "/tmp/c.pem", "-e", "PWD")
    assert half_identity.returncode == 2
    assert "an identity needs --cert, --key and --capath together" in half_identity.stdout


def test_errors_go_to_the_log_not_the_screen(sn: RunningSN, tmp_path: Path) -> None:
    log = tmp_path / "swci.log"
    done = swci(*_context(sn), "-e", "LIST TASKS", "--log-file", str(log))
    assert done.returncode == 0
    assert "connected to SN sn-1" in log.read_text()
    assert done.stderr == ""
    default = swci("-e", "LIST CONTEXTS")
    assert default.returncode == 0
    assert log_file().exists()


def test_with_an_identity_swci_uses_mutual_tls_and_its_cn(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    init_swarm(pki, sl=0, swop=0)
    ca = pki / "ca" / "ca-cert.pem"
    identity = ["--cert", str(pki / "sn-1-cert.pem"), "--key", str(pki / "sn-1-key.pem"), "--capath", str(ca)]
    sn = start_sn(tmp_path / "sn", extra=identity)
    try:
        mine = [
            "--cert",
            str(pki / "swci-1-cert.pem"),
            "--key",
            str(pki / "swci-1-key.pem"),
            "--capath",
            str(ca),
        ]
        context = [f"CREATE CONTEXT secure WITH IP 127.0.0.1 {sn.port}", "SWITCH CONTEXT secure"]
        commands = [*context, "GET CONTEXT INFO", "CREATE CONTRACT signed", "GET CONTRACT INFO signed"]
        done = swci(*mine, "--format", "json", *(arg for command in commands for arg in ("-e", command)))
        assert done.returncode == 0, done.stdout + done.stderr
        results = [json.loads(line) for line in done.stdout.splitlines()]
        assert results[2]["data"]["broker"] == f"mqtts://127.0.0.1:{sn.port}"
        assert results[4]["data"]["created_by"] == "swci-1"
        plain = swci("--connect-timeout", "1", "-e", "LIST CONTRACTS")  # no identity: no plain MQTT there
        assert plain.returncode == 1
        assert f"cannot connect to mqtt://127.0.0.1:{sn.port}" in plain.stdout
        assert "Traceback" not in plain.stdout + plain.stderr
    finally:
        sn.stop()

"""SWCI's web mode and the reference's ``Swci`` class, against a real ``swci --web``, SN and SWOP.

The server is a subprocess (plain HTTP on 127.0.0.1, or mutual TLS with the swarm's certificates); the
client is ``swarmlearning.swci.Swci`` as a user's script would use it, or plain ``urllib`` for requests
that the class never sends (bad input).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from certs import init_swarm
from daemons.broker import free_port
from swarmlearning.swci import Swci
from tests.conftest import RunningSN, start_sn, stop_process
from tests.test_swci_init_script import PULL_TASK, swop  # noqa: F401 - the swop fixture

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).parents[1]
TASKRUNNER = "defaulttaskbb.taskdb.sml.hpe"
LOG = logging.getLogger("test.swci-web")
MULTIPART = "multipart/form-data"


@dataclass
class WebSwci:
    """A ``swci --web`` subprocess."""

    process: subprocess.Popen[bytes]
    port: int
    out: Path
    usr: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def stop(self) -> int:
        return stop_process(self.process)


def start_web(
    tmp_path: Path, *args: str, command: list[str] | None = None, env: dict[str, str] | None = None
) -> WebSwci:
    """Start a web-mode swci on a free port and wait for its ready line."""
    usr = tmp_path / "usr"
    usr.mkdir(exist_ok=True)
    port = free_port()
    out = tmp_path / f"web-{port}.out"
    argv = command or [sys.executable, "-m", "swci.main", "--web", "--web-port", str(port)]
    with out.open("wb") as log:
        process = subprocess.Popen(
            [*argv, "--usr-dir", str(usr), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {}), "SWCI_WEB_PORT": str(port)},
            start_new_session=True,
        )
    web = WebSwci(process, port, out, usr)
    deadline = time.monotonic() + 30
    while "SWCI web server listening on" not in web.output():
        if process.poll() is not None or time.monotonic() > deadline:
            web.stop()
            pytest.fail(f"swci --web did not start:\n{web.output()}")
        time.sleep(0.05)
    return web


@pytest.fixture
def web(sn: RunningSN, tmp_path: Path) -> Iterator[WebSwci]:
    server = start_web(tmp_path)
    yield server
    assert server.stop() == 0, server.output()


def _post(url: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers or {})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - http to the test server
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_swci_class_registers_assigns_and_waits_for_a_task(
    sn: RunningSN,
    web: WebSwci,
    swop: subprocess.Popen[bytes],  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    client = Swci("127.0.0.1", web.port, logger=LOG)
    assert client.createContext("web-ctx", "127.0.0.1", sn.port) == [
        f"Context web-ctx created: mqtt://127.0.0.1:{sn.port}"
    ]
    assert client.switchContext("web-ctx") == [f"Switched to context web-ctx (mqtt://127.0.0.1:{sn.port})"]
    assert any("web-ctx" in line for line in client.listContexts())
    task_file = tmp_path / "pull_user_image.yaml"
    task_file.write_text(PULL_TASK)
    answer = json.loads(client.uploadTaskDefintion(task_file))
    assert answer["CONTENT"] == [
        f"Task definition pull_user_image.yaml uploaded to {web.usr / task_file.name}"
    ]
    assert client.registerTask("pull_user_image.yaml") == ["Registered Task : pull_user_image"]
    assert any(line.startswith("pull_user_image") and "PULL_IMAGE" in line for line in client.listTasks())
    assert client.getTaskBody("pull_user_image")[:2] == ["Tag: latest", "RepoName: user-env-pyt"]
    assert client.isTaskDone(TASKRUNNER)  # IDLE
    assert client.assignTask("pull_user_image", TASKRUNNER, 1) == [
        f"Task pull_user_image assigned to taskrunner {TASKRUNNER} WITH 1 PEERS",
        "Allocation : swop-1: 1",
    ]
    deadline = time.monotonic() + 60
    while not client.isTaskDone(TASKRUNNER):
        assert time.monotonic() < deadline, client.getTaskRunnerStatus(TASKRUNNER)
        time.sleep(0.2)
    assert "TASK_STATE : COMPLETE" in client.getTaskRunnerStatus(TASKRUNNER)
    assert "SWOP UID : swop-1" in client.getTaskRunnerPeerStatus(TASKRUNNER, 0)
    assert client.resetTaskRunner() == [f"Taskrunner {TASKRUNNER} reset"]
    report = client.executeTask("pull_user_image", peers=1, pollWaitInSec=0.2)
    assert "TASK_STATE : COMPLETE" in report
    assert client.getTaskRunnerStatus(TASKRUNNER)[0] == "TASK_STATE : IDLE"  # reset on success
    nodes = client.listNodes()
    assert nodes[0] == "NODE TYPE, HOST IP, PORT, CONTAINER NAME, UUID, PARENT UUID, I-AM-ALIVE"
    assert any(line.startswith("SWOP, ") and "swop-1" in line for line in nodes)
    graph = client.plotTopology()
    assert {"sn-1", "swop-1"} <= set(graph.nodes)


def test_failures_come_back_as_errors_and_the_session_carries_on(
    sn: RunningSN, web: WebSwci, tmp_path: Path
) -> None:
    client = Swci("127.0.0.1", web.port, logger=LOG)
    assert client.listTasks() == []
    assert client.getErrors() == (
        "ERROR no context is active; run CREATE CONTEXT <name> WITH IP <ip> and SWITCH CONTEXT <name> first"
    )
    client.createContext("c", "127.0.0.1", sn.port)
    client.switchContext("c")
    assert client.finalizeTask("nothing") == []
    assert client.getErrors() == "ERROR no task 'nothing'; CREATE TASK it first (LIST TASKS shows the tasks)"
    assert client.cd("/platform/swarm/usr") == ["OK"]  # a command without output says OK
    assert client.pwd() == [str(web.usr)]
    status, body = _post(f"{web.url}/exec?cmd=LIST%20TASKZ")
    assert status == 200
    (error,) = body["CONTENT"]
    assert str(error).startswith("ERROR line 1, col 6: expected CONTEXT, CONTEXTS, CONTRACTS")
    assert str(error).endswith("got 'TASKZ' (did you mean TASKS?)\n  LIST TASKZ\n       ^^^^^")
    assert _post(f"{web.url}/exec?cmd=EXIT")[1]["CONTENT"] == [
        "ERROR EXIT ends a shell session; the web server keeps running (stop it with SIGTERM)"
    ]
    status, body = _post(f"{web.url}/exec?cmd=LIST%20TASKS")
    assert status == 200 and body["RESULT"]["ok"] is True
    assert "ROOTTASK" in str(body["CONTENT"])


def _multipart(name: str, data: bytes, field: str = "file") -> tuple[bytes, dict[str, str]]:
    head = f'--b0\r\nContent-Disposition: form-data; name="{field}"; filename="{name}"\r\n\r\n'.encode()
    return head + data + b"\r\n--b0--\r\n", {"Content-Type": "multipart/form-data; boundary=b0"}


def test_bad_requests_get_4xx_answers_with_an_error_line(web: WebSwci) -> None:
    cases = [
        (f"{web.url}/exec", b"", {}, 400, "ERROR no command: POST /exec?cmd=<SWCI command>"),
        (f"{web.url}/exec?cmd=ls", b"x" * 100_000, {}, 413, "ERROR the request body (100000 bytes)"),
        (f"{web.url}/exec?cmd=" + "x" * 9000, b"", {}, 413, "ERROR the command is 9000 characters"),
        (f"{web.url}/uploadTaskDef", b"junk", {"Content-Type": f"{MULTIPART}; boundary=zz"}, 400, "ERROR"),
        (f"{web.url}/uploadTaskDef", b"a=b", {"Content-Type": "application/x-www-form-urlencoded"}, 400,
         "ERROR expected multipart/form-data with a file in the field 'file'"),
        (f"{web.url}/uploadTaskDef", *_multipart("t.yaml", b"x" * (2 << 20)), 413, "ERROR the request body"),
        (f"{web.url}/uploadTaskDef", *_multipart("t.yaml", b"Name: [unclosed"), 422,
         "ERROR task definition not stored: t.yaml:1:"),
        (f"{web.url}/uploadTaskDef", *_multipart("t.yaml", b"\xff\xfe"), 422,
         "ERROR task definition not stored: t.yaml: not UTF-8 text"),
        (f"{web.url}/uploadTaskDef", *_multipart("..", PULL_TASK.encode()), 422,
         "ERROR task definition not stored: file name '..': use letters"),
        (f"{web.url}/nothing", b"", {}, 404, "ERROR Not Found"),
    ]  # fmt: skip
    for url, body, headers, status, start in cases:
        got_status, answer = _post(url, body, headers)
        assert (got_status, str(answer["CONTENT"][0])[: len(start)]) == (status, start), (url, answer)
    # a file name with directories lands in the session's directory, never outside it
    status, answer = _post(f"{web.url}/uploadTaskDef", *_multipart("../../escape.yaml", PULL_TASK.encode()))
    assert status == 200, answer
    assert (web.usr / "escape.yaml").read_text() == PULL_TASK
    assert not (web.usr.parent.parent / "escape.yaml").exists()
    output = web.output()
    assert "Traceback" not in output
    assert web.process.poll() is None


def test_run_swci_with_swci_mode_web_runs_the_init_script_then_serves(sn: RunningSN, tmp_path: Path) -> None:
    usr = tmp_path / "usr"
    usr.mkdir()
    (usr / "swci-init").write_text(
        f"EXIT ON FAILURE\nCREATE CONTEXT init WITH IP 127.0.0.1 {sn.port}\nSWITCH CONTEXT init\nEXIT\n"
    )
    run_swci = str(Path(sys.executable).parent / "run-swci")
    server = start_web(
        tmp_path,
        "--init-script-name",
        "swci-init",
        command=[run_swci, "-e", "SWCI_MODE=WEB", "--rm", "--name", "swci-web"],
        env={"SWARM_STATE_DIR": str(tmp_path / "state")},
    )
    try:
        assert "Switched to context init" in server.output()
        client = Swci("127.0.0.1", server.port, logger=LOG)
        assert client.getContextInfo()[:1] == ["Context init"]  # the script's context is the session's
        assert any("ROOTTASK" in line for line in client.listTasks())
    finally:
        assert server.stop() == 0, server.output()


# --- mutual TLS -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    init_swarm(root, sl=1, swci=2)
    return root


def test_with_certificates_only_swci_identities_of_the_swarm_that_are_not_revoked_get_in(
    pki: Path, tmp_path: Path
) -> None:
    ca = pki / "ca" / "capath"
    sn = start_sn(
        tmp_path / "sn",
        extra=["--cert", str(pki / "sn-1-cert.pem"), "--key", str(pki / "sn-1-key.pem"), "--capath", str(ca)],
    )
    ids = ["--cert", str(pki / "swci-1-cert.pem"), "--key", str(pki / "swci-1-key.pem"), "--capath", str(ca)]
    server = start_web(tmp_path, *ids)
    try:
        assert f"listening on https://0.0.0.0:{server.port}" in server.output()

        def client(cn: str) -> Swci:
            cert, key = str(pki / f"{cn}-cert.pem"), str(pki / f"{cn}-key.pem")
            return Swci(
                "127.0.0.1", server.port, clientCert=cert, clientPKey=key, clientCABundle=str(ca), logger=LOG
            )

        admin = client("swci-1")
        assert admin.createContext("tls", "127.0.0.1", sn.port) == [
            f"Context tls created: mqtts://127.0.0.1:{sn.port}"
        ]
        admin.switchContext("tls")
        assert any("ROOTTASK" in line for line in admin.listTasks())
        second = client("swci-2")
        assert any("ROOTTASK" in line for line in second.listTasks())
        assert admin._exec('revoke identity swci-2 "left the project"') == ["Identity swci-2 revoked"]
        assert second.listNodes() == []
        revoked = "ERROR the client certificate 'swci-2' is revoked (LIST REVOKED IDENTITIES)"
        assert second.getErrors() == revoked
        intruder = client("sl-1")
        assert intruder.listTasks() == []
        assert intruder.getErrors() == (
            "ERROR the client certificate 'sl-1' is of role 'sl'; this server accepts role swci only"
        )
        plain = Swci("127.0.0.1", server.port, logger=LOG)
        assert plain.listTasks() == []
        assert (plain.getErrors() or "").startswith(
            f"ERROR : the request to http://127.0.0.1:{server.port} failed"
        )
        foreign = tmp_path / "foreign"
        init_swarm(foreign, sl=1)
        stranger = Swci(
            "127.0.0.1",
            server.port,
            clientCert=str(foreign / "swci-1-cert.pem"),
            clientPKey=str(foreign / "swci-1-key.pem"),
            logger=LOG,
        )
        assert stranger.listTasks() == []
        assert "ERROR : the request to https://" in (stranger.getErrors() or "")
        assert server.process.poll() is None
    finally:
        assert server.stop() == 0, server.output()
        sn.stop()

"""The ML fork server: a forked program is the program a fresh interpreter runs, what a fork cannot give
is refused (at once, by the server's spec, and again at its socket), bad bytes never hurt it, exit
statuses reach the SL, and a stopped server lets its running programs end first. Real server processes,
real forks, a real SL-side client (``daemons/sl/forked.py``) and ``MLProcess``."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemons.processes import FORKSERVER_ENV, program_environ
from daemons.sl.forked import ForkRefusedError, start_forked
from daemons.sl.mlprocess import MLProcess, MLSpec
from daemons.swop import forkservers
from daemons.swop.forkservers import ForkServers, fork_servers_enabled
from taskdefs import RunSwarmBody, parse_swop_profile
from wire.errors import CodecError
from wire.forks import (
    ForkRequest,
    ServerSpec,
    decode_reply,
    decode_request,
    refusal,
)
from wire.frames import HEADER_PREFIX, encode_frame_head, header_length

PROBE = """\
import json, logging, os, random, signal, sys, threading
import numpy, torch
print(json.dumps({
    "argv": sys.argv, "path0": sys.path[0], "path": sys.path[1:], "cwd": os.getcwd(), "file": __file__,
    "name": __name__, "spec": repr(__spec__), "main": sys.modules["__main__"].__file__,
    "env": {k: v for k, v in os.environ.items() if k.startswith("PROBE")},
    "session": os.getsid(0) == os.getpid(), "group": os.getpgid(0) == os.getpid(),
    "signals": {s.name: str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD,
                                                          signal.SIGPIPE)},
    "stdout": [sys.stdout.line_buffering, sys.stdout.write_through, sys.stdout.encoding],
    "stderr": [sys.stderr.line_buffering, sys.stderr.write_through, sys.stderr.errors],
    "stdin": sys.stdin.read(), "handlers": len(logging.root.handlers), "threads": threading.active_count(),
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    "cmdline": open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode().strip(),
    "random": [random.random(), float(numpy.random.random()), torch.rand(1).item()],
}))
sys.exit(int(sys.argv[1]))
"""
FAIL = "import sys\n\ndef deep():\n    raise ValueError('broken on purpose')\n\ndeep()\n"
MESSAGE = "import sys\nsys.exit('no data here')\n"
WAIT = (  # until told to go; never more than a minute, so that a failed test leaves no program behind
    "import os, time\nend = time.monotonic() + 60\n"
    "while not os.path.exists('go') and time.monotonic() < end:\n    time.sleep(0.05)\nprint('went')\n"
)
LIMIT = 1 << 20


# ------------------------------------------------------------------------------------ the messages
def test_a_request_round_trips_and_malformed_ones_are_refused() -> None:
    request = ForkRequest(("/usr/bin/python3", "a.py", "x"), "/tmp", {"A": "1"})
    framed = request.encode()
    assert header_length(framed[: HEADER_PREFIX.size]) == len(framed) - HEADER_PREFIX.size
    assert decode_request(framed[HEADER_PREFIX.size :]) == request
    for body in (
        {"op": "fork", "argv": [], "cwd": "/", "env": {}},
        {"op": "fork", "argv": ["p"], "cwd": "", "env": {}},
        {"op": "fork", "argv": ["p", 3], "cwd": "/", "env": {}},
        {"op": "fork", "argv": ["p"], "cwd": "/", "env": {"A=B": "1"}},
        {"op": "fork", "argv": ["p"], "cwd": "/", "env": {"A": "1"}, "more": 1},
        {"op": "run", "argv": ["p"], "cwd": "/", "env": {}},
    ):
        with pytest.raises(CodecError, match="fork request"):
            decode_request(encode_frame_head(body)[HEADER_PREFIX.size :])
    with pytest.raises(CodecError, match="op"):
        decode_request(encode_frame_head({"argv": ["p"]})[HEADER_PREFIX.size :])
    with pytest.raises(CodecError, match="outside"):
        header_length(HEADER_PREFIX.pack(0))


def test_a_reply_is_a_pid_a_refusal_or_an_exit_status() -> None:
    assert decode_reply(encode_frame_head({"op": "pid", "pid": 12})[HEADER_PREFIX.size :]).pid == 12
    assert decode_reply(encode_frame_head({"op": "exit", "exit": -15})[HEADER_PREFIX.size :]).exit == -15
    assert (
        decode_reply(encode_frame_head({"op": "refused", "refused": "no"})[HEADER_PREFIX.size :]).refused
        == "no"
    )
    for body in (
        {"op": "pid", "pid": 0},
        {"op": "pid", "pid": 1, "exit": 0},
        {"op": "exit", "exit": "0"},
        {"op": "exit", "exit": True},
        {"op": "done"},
    ):
        with pytest.raises(CodecError, match="fork server reply"):
            decode_reply(encode_frame_head(body)[HEADER_PREFIX.size :])


@pytest.mark.parametrize(
    ("argv", "env", "reason"),
    [
        (["/usr/bin/python9", "p.py"], {}, "not the fork server's interpreter"),
        ([sys.executable, "-O", "p.py"], {}, "only 'python [-u] script.py"),
        ([sys.executable, "-u"], {}, "only 'python [-u] script.py"),
        ([sys.executable, "missing.py"], {}, "missing.py is not a script file"),
        ([sys.executable, "p.py"], {"OMP_NUM_THREADS": "3"}, "OMP_NUM_THREADS differs"),
        ([sys.executable, "p.py"], {"CUDA_VISIBLE_DEVICES": "1"}, "CUDA_VISIBLE_DEVICES differs"),
        ([sys.executable, "p.py"], {"PYTHONPATH": "/x"}, "PYTHONPATH differs"),
    ],
)
def test_refusal_names_what_a_fork_cannot_give(
    tmp_path: Path, argv: list[str], env: dict[str, str], reason: str
) -> None:
    (tmp_path / "p.py").write_text("")
    server = ServerSpec.of(sys.executable, {"OMP_NUM_THREADS": "1", "PATH": "/bin"})
    why = refusal(ForkRequest(tuple(argv), str(tmp_path), {"OMP_NUM_THREADS": "1", **env}), server)
    assert why is not None
    assert reason in why


def test_what_a_fork_can_give_is_not_refused(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text("")
    server = ServerSpec.of(sys.executable, {"OMP_NUM_THREADS": "1", "PATH": "/bin"})
    assert server.env == {"OMP_NUM_THREADS": "1"}  # only what is read at import time
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin", "DATA_DIR": "d", "PYTHONUNBUFFERED": "1"}
    assert refusal(ForkRequest((sys.executable, "-u", "p.py", "--x"), str(tmp_path), env), server) is None


def test_a_server_spec_reads_back_and_a_bad_one_is_an_error(tmp_path: Path) -> None:
    spec = ServerSpec.of("/py", {"LANG": "C.UTF-8", "X": "1"})
    spec.write(tmp_path / "s.json")
    assert ServerSpec.read(tmp_path / "s.json") == spec
    (tmp_path / "bad.json").write_text('{"executable": 3, "env": {}}')
    with pytest.raises(CodecError, match="expected executable and env"):
        ServerSpec.read(tmp_path / "bad.json")
    (tmp_path / "worse.json").write_text("{")
    with pytest.raises(CodecError, match="not JSON"):
        ServerSpec.read(tmp_path / "worse.json")


def test_fork_servers_are_on_unless_switched_off() -> None:
    assert fork_servers_enabled({})
    assert fork_servers_enabled({FORKSERVER_ENV: "/tmp/x.sock"})
    assert not fork_servers_enabled({FORKSERVER_ENV: "0"})
    assert not fork_servers_enabled({FORKSERVER_ENV: "off"})


def test_a_programs_environment_leaves_out_what_the_daemons_set_for_themselves() -> None:
    base = {"OPENBLAS_NUM_THREADS": "1", "SWARM_BLAS_LIMITED": "1", FORKSERVER_ENV: "/s", "A": "1"}
    assert program_environ(base, {"B": "2"}, {"A": "3"}) == {"A": "3", "B": "2"}
    mine = {"OPENBLAS_NUM_THREADS": "4", "A": "1"}  # the user's own setting stays
    assert program_environ(mine) == mine


# -------------------------------------------------------------------------------------- the server
def _start_server(
    path: Path, *, preload: str, watch_stdin: bool = False, remove_dir: bool = False
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "swarmlearning.forkserver", "--socket", str(path), "--preload", preload]
    argv += ["--watch-stdin"] * watch_stdin + ["--remove-dir"] * remove_dir
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": ""},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("fork server: listening on"), line
    return proc


def _stop_server(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fork server with numpy and torch preloaded, for the whole module."""
    path = tmp_path_factory.mktemp("fork") / "fs.sock"
    proc = _start_server(path, preload="numpy,torch")
    yield str(path)
    out = _stop_server(proc)
    assert "fork server: stopped" in out


def _program(tmp_path: Path, name: str, text: str) -> tuple[list[str], str, dict[str, str]]:
    sub = tmp_path / "src"
    sub.mkdir(exist_ok=True)
    (sub / name).write_text(text)
    (tmp_path / "model").symlink_to(sub, target_is_directory=True)  # as a node's run directory has it
    env = program_environ(os.environ, {"PROBE_NODE": "n1", "PYTHONUNBUFFERED": "1"})
    return [sys.executable, f"model/{name}"], str(tmp_path), env


async def _forked(server: str, argv: list[str], cwd: str, env: dict[str, str]) -> tuple[str, int]:
    program = await start_forked(server, argv, Path(cwd), env, limit=LIMIT)
    out = await program.stdout.read()
    return out.decode(), await program.wait()


async def _fresh(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[str, int]:
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    out, _ = await proc.communicate()
    return out.decode(), await proc.wait()


def _probe(out: str) -> dict[str, Any]:
    return dict(json.loads(out.strip().splitlines()[-1]))


async def test_a_forked_program_is_the_program_a_fresh_interpreter_runs(server: str, tmp_path: Path) -> None:
    argv, cwd, env = _program(tmp_path, "probe.py", PROBE)
    fresh_out, fresh_code = await _fresh([*argv, "3"], cwd, env)
    forked_out, forked_code = await _forked(server, [*argv, "3"], cwd, env)
    other_out, _ = await _forked(server, [*argv, "0"], cwd, env)
    assert (fresh_code, forked_code) == (3, 3)
    fresh, forked, other = _probe(fresh_out), _probe(forked_out), _probe(other_out)
    del fresh["random"]
    if importlib.util.find_spec("setproctitle") is None:  # a machine with our wheel alone (the GPU machine's)
        del fresh["cmdline"]
    assert {k: v for k, v in forked.items() if k in fresh} == fresh
    assert forked["path0"] == str(tmp_path / "src")  # the script's real directory, as the interpreter has it
    assert forked["env"] == {"PROBE_NODE": "n1"}
    assert forked["session"] and forked["group"] and forked["stdin"] == ""
    assert forked["fds"] == [0, 1, 2, 3]  # nothing of the server's (3: the probe's own listing)
    # seeds drawn afresh: not the server's, not shared by the forks (random, numpy, torch)
    assert all(a != b for a, b in zip(forked["random"], other["random"], strict=True))


async def test_exit_statuses_and_errors_are_the_programs(server: str, tmp_path: Path) -> None:
    argv, cwd, env = _program(tmp_path, "fail.py", FAIL)
    out, code = await _forked(server, argv, cwd, env)
    assert code == 1
    assert "ValueError: broken on purpose" in out
    assert 'fail.py", line 4, in deep' in out
    assert "forkserver" not in out  # the traceback starts at the program, as a fresh interpreter's does
    (tmp_path / "src" / "message.py").write_text(MESSAGE)
    out, code = await _forked(server, [sys.executable, "model/message.py"], cwd, env)
    assert (code, out.strip()) == (1, "no data here")


async def test_a_forked_program_is_stopped_by_its_process_group(server: str, tmp_path: Path) -> None:
    argv, cwd, env = _program(tmp_path, "wait.py", WAIT)
    program = await start_forked(server, argv, Path(cwd), env, limit=LIMIT)
    os.killpg(program.pid, signal.SIGTERM)
    assert await program.wait() == -signal.SIGTERM
    assert program.returncode == -signal.SIGTERM


async def test_the_socket_refuses_what_the_spec_refuses(server: str, tmp_path: Path) -> None:
    argv, cwd, env = _program(tmp_path, "probe.py", PROBE)
    other = {**env, "OMP_NUM_THREADS": "7"}
    with pytest.raises(ForkRefusedError, match="OMP_NUM_THREADS differs"):  # the spec, before connecting
        await start_forked(server, argv, Path(cwd), other, limit=LIMIT)
    reply = _raw_request(server, ForkRequest(tuple(argv), cwd, other).encode())  # past the spec's check
    assert "OMP_NUM_THREADS differs" in str(reply.get("refused"))


def _raw_request(server: str, data: bytes, *, fds: int = 1) -> dict[str, Any]:
    read_fd, write_fd = os.pipe()
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(30)
            sock.connect(server)
            socket.send_fds(sock, [data], [write_fd] * fds)
            head = sock.recv(HEADER_PREFIX.size)
            if not head:
                return {}
            body = sock.recv(header_length(head))
            reply = decode_reply(body)
            return {k: v for k, v in vars(reply).items() if v is not None}
    finally:
        os.close(read_fd)
        os.close(write_fd)


async def test_bad_bytes_get_a_refusal_and_the_server_serves_on(server: str, tmp_path: Path) -> None:
    garbage = HEADER_PREFIX.pack(5) + b"\xc1\xc1\xc1\xc1\xc1"
    assert "not valid msgpack" in str(_raw_request(server, garbage).get("refused"))
    assert "outside" in str(_raw_request(server, HEADER_PREFIX.pack(1 << 30)).get("refused"))
    argv, cwd, env = _program(tmp_path, "probe.py", PROBE)
    two = _raw_request(server, ForkRequest(tuple(argv), cwd, env).encode(), fds=2)
    assert "one file descriptor" in str(two.get("refused"))
    with socket.socket(socket.AF_UNIX) as sock:  # a client that goes away halfway through
        sock.connect(server)
        sock.sendall(HEADER_PREFIX.pack(100) + b"\x80")
    out, code = await _forked(server, [*argv, "0"], cwd, env)
    assert code == 0
    assert _probe(out)["env"] == {"PROBE_NODE": "n1"}


async def test_a_stopped_server_lets_its_program_end_and_reports_it(tmp_path: Path) -> None:
    path = tmp_path / "fs.sock"
    proc = _start_server(path, preload="", watch_stdin=True)
    argv, cwd, env = _program(tmp_path, "wait.py", WAIT)
    program = await start_forked(str(path), argv, Path(cwd), env, limit=LIMIT)
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None
    line = await asyncio.to_thread(proc.stdout.readline)
    while "stopped listening" not in line and line:
        line = await asyncio.to_thread(proc.stdout.readline)
    assert "stopped listening; 1 program(s) still running" in line
    assert not path.exists()
    assert not ServerSpec.path_for(str(path)).exists()
    with pytest.raises(FileNotFoundError):  # no new programs
        await start_forked(str(path), argv, Path(cwd), env, limit=LIMIT)
    assert proc.poll() is None  # still there for the one it runs
    (tmp_path / "go").write_text("")
    assert (await program.stdout.read()).decode().strip() == "went"
    assert await program.wait() == 0
    assert "fork server: stopped" in _stop_server(proc)


def test_a_server_stopped_while_it_imports_ends_at_once(tmp_path: Path) -> None:
    proc = _start_server(tmp_path / "fs.sock", preload="numpy,torch,torch._dynamo")
    proc.send_signal(signal.SIGTERM)  # it has only just begun to import torch
    assert proc.wait(timeout=5) == -signal.SIGTERM  # no program to wait for: not after the imports


def test_a_server_whose_parent_is_gone_stops_and_takes_its_folder_along(tmp_path: Path) -> None:
    folder = tmp_path / "forks"
    folder.mkdir()
    proc = _start_server(folder / "fs.sock", preload="", watch_stdin=True, remove_dir=True)
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    assert not folder.exists()  # a SWOP killed at once leaves no folder behind


# -------------------------------------------------------------------------- the SL's and the SWOP's
async def test_an_sl_forks_its_program_and_starts_it_itself_when_refused_or_alone(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="swarm.sl.ml")
    (tmp_path / "hello.py").write_text("import os\nprint('hello', os.environ['WHO'])\n")
    spec = MLSpec(entrypoint=sys.executable, command="hello.py", cwd=tmp_path, env={"WHO": "node"})
    for where, env, said in (
        (server, {}, "forked from the host's fork server"),
        (server, {"OMP_NUM_THREADS": "5"}, "the fork server does not start this program (OMP_NUM_THREADS"),
        (str(tmp_path / "none.sock"), {}, "no fork server at"),
    ):
        caplog.clear()
        monkeypatch.setenv(FORKSERVER_ENV, where)
        ml = MLProcess(spec)
        await ml.start(env)
        assert await ml.wait() == 0
        assert list(ml.tail) == ["hello node"]
        assert said in caplog.text
    await _let_transports_close()


async def _let_transports_close() -> None:
    """asyncio closes a subprocess's transport a few callbacks after its pipes ended; a test's loop closed
    before that leaves the transport to the garbage collector, which then complains in another test."""
    await asyncio.sleep(0.1)


async def test_a_swop_keeps_a_server_for_each_import_time_environment_of_its_programs() -> None:
    common = program_environ(os.environ)
    programs = {
        1: {**common, "DATA": "a", "CUDA_VISIBLE_DEVICES": "0"},
        2: {**common, "DATA": "b", "CUDA_VISIBLE_DEVICES": "0"},
        3: {**common, "DATA": "c", "CUDA_VISIBLE_DEVICES": "1"},
    }
    async with ForkServers() as forks:
        found = await forks.sockets_for(sys.executable, common, programs)
        again = await forks.sockets_for(sys.executable, common, programs)
        path, other = found[1], found[3]
        assert path is not None
        assert other is not None
        assert found == again == {1: path, 2: path, 3: other}  # started once, kept for the next task
        assert path != other
        assert ServerSpec.read(ServerSpec.path_for(path)).env["CUDA_VISIBLE_DEVICES"] == "0"
        assert ServerSpec.read(ServerSpec.path_for(other)).env["CUDA_VISIBLE_DEVICES"] == "1"
    assert not await asyncio.to_thread(os.path.exists, path)
    async with ForkServers(enabled=False) as forks:
        assert await forks.sockets_for(sys.executable, common, programs) == dict.fromkeys(programs)
    await _let_transports_close()


GPU_NODE = """\
  - slnodedef:
      idx: {idx}
      identity: []
      slhostname: sl{idx}
      privatedata: ~
      slenvvars: ~
      usrhostname: u{idx}
      usrenvvars: ~
      usrcontaineropts:
        - gpus: auto
"""
GPU_PROFILE = """\
groupname: test
taskrunner: defaulttaskbb.taskdb.sml.hpe
policyuri: ~
resourcemgr: {mgrtype: DOCKER, accessinfo: {accesstype: FROMENV}}
network: test-net
apls: {locator: {host: 127.0.0.1, port: ~}}
apisrv: {locator: {host: ~, port: ~, service: ~}}
envvars: ~
nodes:
"""


async def test_a_node_that_starts_alone_keeps_its_gpu_slot_in_its_servers_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restarted SWOP starts only some of its nodes: a node's GPUs ("auto", round robin) still come from
    its place among all of them, as its SL's ``--gpu-slot`` does, so its server's CUDA_VISIBLE_DEVICES is
    the one its program gets."""
    monkeypatch.setattr(forkservers, "visible_gpus", lambda: ["0", "1"])  # two GPUs, on any machine
    profile = parse_swop_profile(GPU_PROFILE + GPU_NODE.format(idx=0) + GPU_NODE.format(idx=1))
    body = RunSwarmBody.model_validate(
        {"Command": "model/m.py", "Entrypoint": "python3", "WorkingDir": "/tmp/test", "Envvars": None,
         "PrivateContent": None, "SharedContent": None}
    )  # fmt: skip
    async with ForkServers() as forks:
        found = await forks.for_nodes(sys.executable, profile, body, profile.node_defs, starting={1})
        assert list(found) == [1]
        path = found[1]
        assert path is not None
        assert ServerSpec.read(ServerSpec.path_for(path)).env["CUDA_VISIBLE_DEVICES"] == "1"  # slot 1, not 0
    await _let_transports_close()

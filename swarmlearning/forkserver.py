"""The ML fork server: one interpreter imports torch once, and each ML program of a host is a fork of it.

Four nodes on one host each start ``python3 model.py``, and each of them imports torch, numpy and this
library (about 2.5 s of CPU on an EPYC core, most of a small job's start). A SWOP starts this server
with the ML environment's interpreter and environment (``python -m swarmlearning.forkserver --socket
PATH``); it imports ``PRELOAD`` once, and every SL of the SWOP asks it to start its program
(``wire/forks.py``): the server forks, and the child becomes ``python3 model.py`` — its own session,
working directory, environment, argv, ``sys.path[0]``, stdio on the SL's pipe, fresh random seeds, and
``__main__`` run from the script. The SL reads the program's output as before and learns its exit status
from the server.

What a fork cannot give is refused (``wire.forks.refusal``), and the SL then starts the program itself,
as without a server: another interpreter, Python options other than ``-u``, torchrun, a program that is
not a script, or an environment that differs from the server's in a variable read while the preloaded
modules were imported (``wire.forks.IMPORT_TIME``: ``PYTHON*``, thread counts of OpenMP/MKL/OpenBLAS,
``CUDA_*``, ``TORCH*``, locale, ...). The server describes itself in ``<socket>.json`` first, so an
SL learns of a refusal at once, not after the imports. The server never initialises CUDA, so a child
may. Hash randomisation is the server's for every child (``PYTHONHASHSEED``), and warnings the preloaded
modules gave at import are in the server's log.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import importlib
import importlib.machinery
import io
import os
import random
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import types
from dataclasses import dataclass
from types import FrameType, TracebackType

from wire.errors import CodecError
from wire.forks import ForkRequest, ServerSpec, decode_request, refusal, split_python_argv
from wire.frames import HEADER_PREFIX, encode_frame_head, header_length

__all__ = ["PRELOAD", "ForkServer", "Program", "main", "run_program"]

PRELOAD = ("numpy", "torch", "torch._dynamo", "swarmlearning.pyt")
_PEERCRED = struct.Struct("3i")


def _say(line: str) -> None:
    """A line for the SWOP's log; none when the SWOP is gone (its pipe closed)."""
    with contextlib.suppress(OSError, ValueError):
        print(f"fork server: {line}", flush=True)


@dataclass(frozen=True)
class Program:
    """What a child becomes: ``script`` with ``args``, in ``cwd`` with ``env``, writing to ``out_fd``;
    ``argv``: the command line it stands for."""

    argv: tuple[str, ...]
    script: str
    args: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    out_fd: int
    unbuffered: bool

    @classmethod
    def of(cls, request: ForkRequest, out_fd: int) -> Program:
        """The program ``request`` (accepted by ``refusal``) asks for."""
        dash_u, rest = split_python_argv(request.argv)
        unbuffered = dash_u or bool(request.env.get("PYTHONUNBUFFERED"))
        return cls(request.argv, rest[0], tuple(rest[1:]), request.cwd, dict(request.env), out_fd, unbuffered)


class _Connection:
    """One SL's connection: its request as it arrives, then the program it started."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = bytearray()
        self.fds: list[int] = []
        self.done = False  # the request was answered

    def request(self) -> bytes | None:
        """The request's body once it is all here."""
        if len(self.data) < HEADER_PREFIX.size:
            return None
        end = HEADER_PREFIX.size + header_length(bytes(self.data[: HEADER_PREFIX.size]))
        return bytes(self.data[HEADER_PREFIX.size : end]) if len(self.data) >= end else None

    def send(self, body: dict[str, object]) -> None:
        """A reply; a connection that cannot take it any more is closed."""
        try:
            self.sock.sendall(encode_frame_head(body))
        except OSError:
            self.close()

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        self.sock.close()


class ForkServer:
    """Accepts requests on a unix socket and forks a child for each one it can start."""

    def __init__(self, path: str, *, watch_stdin: bool = False, remove_dir: bool = False) -> None:
        self.path = path
        self._remove_dir = remove_dir
        self.spec = ServerSpec.of(sys.executable, os.environ)
        self._watch_stdin = watch_stdin
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = os.pipe()
        self._children: dict[int, _Connection | None] = {}
        self._connections: set[_Connection] = set()
        self._stopping = False

    # ----------------------------------------------------------------------------- parent
    def listen(self) -> None:
        """Describe this server (``ServerSpec``) and bind its socket (for this user only). Until ``serve``,
        while the preloads are imported, SIGTERM ends the server at once, as it would any interpreter."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_mask = os.umask(0o177)
        try:
            self.spec.write(ServerSpec.path_for(self.path))
            listener.bind(self.path)
        finally:
            os.umask(old_mask)
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, "listener")
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        if self._watch_stdin:  # the SWOP holds our stdin: its end means the SWOP is gone
            self._selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGCHLD:
            self._stopping = True

    def serve(self) -> Program | None:
        """Serve until stopped and every child has ended (None); in a child, return its program."""
        signal.set_wakeup_fd(self._wake_w)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        while not (self._stopping and not self._children):
            for key, _ in self._selector.select():
                program = self._on_ready(key)
                if program is not None:
                    return program
            self._reap()
            if self._stopping:
                self._stop_listening()
        return None

    def _on_ready(self, key: selectors.SelectorKey) -> Program | None:
        if key.data == "listener":
            self._accept()
        elif key.data == "wake":
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 512)
        elif key.data == "stdin":
            if not os.read(sys.stdin.fileno(), 512):
                self._selector.unregister(sys.stdin.fileno())
                self._stopping = True
        else:
            return self._on_data(key.data)
        return None

    def _accept(self) -> None:
        assert self._listener is not None  # noqa: S101 - registered by listen()
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        _pid, uid, _gid = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
        if uid != os.getuid():
            sock.close()
            return
        sock.setblocking(False)
        conn = _Connection(sock)
        self._connections.add(conn)
        self._selector.register(sock, selectors.EVENT_READ, conn)

    def _on_data(self, conn: _Connection) -> Program | None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn.sock, 65536, 4)
        except BlockingIOError:
            return None
        except OSError:
            data, fds = b"", []
        conn.fds.extend(fds)
        if not data:  # the SL went away; its program, if any, runs on
            self._forget(conn)
            return None
        if conn.done:
            return None
        conn.data.extend(data)
        try:
            body = conn.request()
            if body is None:
                return None
            return self._answer(conn, decode_request(body))
        except CodecError as exc:
            conn.send({"op": "refused", "refused": str(exc)})
            self._forget(conn)
            return None

    def _answer(self, conn: _Connection, request: ForkRequest) -> Program | None:
        conn.done = True
        why = self._refusal(request, conn)
        if why is not None:
            conn.send({"op": "refused", "refused": why})
            self._forget(conn)
            return None
        out_fd = conn.fds.pop()
        with contextlib.suppress(OSError, ValueError):  # nothing of ours left in a buffer the child has too
            sys.stdout.flush()
            sys.stderr.flush()
        ready_r, ready_w = os.pipe()  # the child's session is made before its pid is given out
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            self._become_child()
            os.close(ready_w)
            return Program.of(request, out_fd)
        os.close(ready_w)
        os.read(ready_r, 1)  # its end of the pipe closed: it has its own session and process group
        os.close(ready_r)
        os.close(out_fd)
        self._children[pid] = conn
        conn.send({"op": "pid", "pid": pid})
        _say(f"started {' '.join(request.argv[1:])} as pid {pid} in {request.cwd}")
        return None

    def _refusal(self, request: ForkRequest, conn: _Connection) -> str | None:
        if len(conn.fds) != 1:
            return f"a request comes with one file descriptor (its output pipe), not {len(conn.fds)}"
        if self._stopping:
            return "the fork server is stopping"
        if threading.active_count() > 1:
            return "the fork server runs threads, and forking it would not be safe"
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return "CUDA was initialised in the fork server"
        return refusal(request, self.spec)

    def _forget(self, conn: _Connection) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        self._connections.discard(conn)
        for pid, owner in self._children.items():
            if owner is conn:
                self._children[pid] = None
        conn.close()

    def _reap(self) -> None:
        while self._children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self._children.pop(pid, None)
            if conn is not None:
                conn.send({"op": "exit", "exit": os.waitstatus_to_exitcode(status)})
                self._forget(conn)

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
            for path in (self.path, ServerSpec.path_for(self.path)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            if self._remove_dir:  # the last of a SWOP's servers to stop takes its private folder along
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.dirname(self.path))
            # said once the socket is gone, so that whoever reads it finds nothing left to connect to
            _say(f"stopped listening; {len(self._children)} program(s) still running")

    # ------------------------------------------------------------------------------ child
    def _become_child(self) -> None:
        """Drop everything of the server: its signals, sockets, pipes and session."""
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self._selector.close()
        if self._listener is not None:
            self._listener.close()
        for conn in self._connections:
            conn.sock.close()
            for fd in conn.fds:
                os.close(fd)
        os.close(self._wake_r)
        os.close(self._wake_w)
        os.setsid()


# ---------------------------------------------------------------------------------- child side
def _stdio(program: Program) -> None:
    """Fds 0-2 as a fresh interpreter under the SL has them, and ``sys.std*`` over them as it makes them
    (stdout and stderr unbuffered with ``-u`` or ``PYTHONUNBUFFERED``, stderr line-buffered otherwise)."""
    os.dup2(program.out_fd, 1)
    os.dup2(program.out_fd, 2)
    os.close(program.out_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    unbuffered = program.unbuffered

    def text(fd: int, like: io.TextIOBase | None, *, line: bool, write: bool) -> io.TextIOWrapper:
        encoding = getattr(like, "encoding", None)
        errors = getattr(like, "errors", None)
        raw = open(fd, "wb" if write else "rb", buffering=0 if unbuffered and write else -1, closefd=False)  # noqa: SIM115
        return io.TextIOWrapper(
            raw, encoding, errors, line_buffering=line and not unbuffered, write_through=unbuffered and write
        )

    sys.stdin = sys.__stdin__ = text(0, sys.__stdin__, line=False, write=False)  # type: ignore[misc]
    sys.stdout = sys.__stdout__ = text(1, sys.__stdout__, line=False, write=True)  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = text(2, sys.__stderr__, line=True, write=True)  # type: ignore[misc]


def _reseed() -> None:
    """Seeds that a fresh interpreter draws from the OS, drawn again: not the server's, shared by all."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def _user_traceback(tb: TracebackType | None, script: str) -> TracebackType | None:
    """``tb`` from the script's first frame on (the server's frames left out)."""
    start = tb
    while start is not None and start.tb_frame.f_code.co_filename != script:
        start = start.tb_next
    return start if start is not None else tb


def _run_main(script: str) -> None:
    """Run ``script`` as the interpreter runs ``python script``: a new ``__main__`` module."""
    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    main.__cached__ = None  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    with io.open_code(script) as source:
        code = compile(source.read(), script, "exec", dont_inherit=True)
    exec(code, main.__dict__)  # noqa: S102 - running the user's program is what this is for


def _title(argv: tuple[str, ...]) -> None:
    """The command line ``ps`` shows: the program's, not the server's (where setproctitle is installed)."""
    setproctitle = sys.modules.get("setproctitle")
    if setproctitle is not None:
        setproctitle.setproctitle(" ".join(argv))


def run_program(program: Program) -> int | str | None:
    """Become ``program`` and run it as ``python script args`` would; what ``sys.exit`` should get."""
    _title(program.argv)
    _stdio(program)
    os.chdir(program.cwd)
    os.environ.clear()
    os.environ.update(program.env)
    _reseed()
    script = os.path.abspath(program.script)
    sys.argv = [program.script, *program.args]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    try:
        _run_main(script)
    except SystemExit as exc:
        code = exc.code
        return code if code is None or isinstance(code, int) else str(code)
    except KeyboardInterrupt:
        sys.stdout.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # as the interpreter reports an interrupt: killed by SIGINT
        return 1
    except BaseException as exc:  # reported as the interpreter reports it
        tb = _user_traceback(exc.__traceback__, script)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        return 1
    return 0


def _preload(names: list[str]) -> None:
    started, loaded, failed = time.monotonic(), [], []
    for name in names:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as exc:  # a module this environment lacks is not preloaded
            failed.append(f"{name} ({type(exc).__name__}: {exc})")
    took = time.monotonic() - started
    _say(f"preloaded {', '.join(loaded) or 'nothing'} in {took:.2f} s")
    if failed:
        _say(f"not preloaded: {'; '.join(failed)}")


def main(argv: list[str] | None = None) -> None:
    """``python -m swarmlearning.forkserver --socket PATH [--preload a,b] [--watch-stdin]``."""
    parser = argparse.ArgumentParser(prog="python -m swarmlearning.forkserver", description=__doc__)
    parser.add_argument("--socket", required=True, help="the unix socket to listen on")
    parser.add_argument(
        "--preload", default=",".join(PRELOAD), help="modules to import once (default %(default)s)"
    )
    parser.add_argument(
        "--watch-stdin", action="store_true", help="stop when stdin ends (the parent is gone)"
    )
    parser.add_argument(
        "--remove-dir", action="store_true", help="remove the socket's folder at the end if it is empty"
    )
    args = parser.parse_args(argv)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # what a careless parent left open, no child of ours gets
    with contextlib.suppress(ImportError):  # for _title(); an environment without it shows ours
        importlib.import_module("setproctitle")
    server = ForkServer(args.socket, watch_stdin=args.watch_stdin, remove_dir=args.remove_dir)
    server.listen()
    _say(f"listening on {args.socket}")
    _preload([name for name in args.preload.split(",") if name])
    program = server.serve()
    if program is None:
        _say("stopped")
        return
    sys.exit(run_program(program))  # in a child: the interpreter ends as the program's would


if __name__ == "__main__":
    main()

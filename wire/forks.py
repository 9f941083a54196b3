"""Messages on the ML fork server's socket: a request to start a program, and the server's replies.

Every message is a frame of the local socket without payload (``wire/frames.py``: ``u32 length |
msgpack header`` with its ``op``). A request ``{op: "fork", argv, cwd, env}`` comes with one file
descriptor attached (``SCM_RIGHTS``): the write end of the pipe the program's stdout and stderr go to.
The server answers on the same connection with ``{op: "pid", pid: N}`` (the program runs) or ``{op:
"refused", refused: reason}`` (the caller starts it itself), and after ``pid``, once the program has
ended, ``{op: "exit", exit: code}`` (``-N`` when signal N ended it, as ``asyncio`` reports it).

Before it listens, the server describes itself in ``<socket>.json`` (``ServerSpec``: its interpreter
and the variables of its environment read at import time), so that a caller can tell at once, with
``refusal``, what the server would refuse, even while the server is still importing torch.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wire.errors import CodecError
from wire.files import read_bounded
from wire.frames import decode_header, encode_frame_head

__all__ = [
    "IMPORT_TIME",
    "MAX_SPEC_BYTES",
    "ForkReply",
    "ForkRequest",
    "ServerSpec",
    "decode_reply",
    "decode_request",
    "import_time",
    "refusal",
    "split_python_argv",
]

MAX_SPEC_BYTES = 1 << 20

# Environment variables read at interpreter start or while torch, numpy and their libraries are imported:
# a child whose value differs from the server's would not be the program a fresh interpreter runs.
# Prefixes, then whole names.
IMPORT_TIME = (
    "PYTHON", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "GOTO", "BLIS_", "VECLIB_", "NUMEXPR_", "NUMPY_",
    "TORCH", "PYTORCH_", "CUDA_", "CUBLAS", "CUDNN_", "NVIDIA_", "NCCL_", "LD_", "MALLOC_", "LC_", "XLA_",
)  # fmt: skip
IMPORT_TIME_NAMES = frozenset({"LANG", "LANGUAGE", "TMPDIR", "HOME"})
EMULATED = frozenset({"PYTHONUNBUFFERED"})  # a child sets up its stdio as this asks


def import_time(name: str) -> bool:
    """Whether environment variable ``name`` must be the server's for a fork to be a fresh program."""
    return name not in EMULATED and (name in IMPORT_TIME_NAMES or name.startswith(IMPORT_TIME))


@dataclass(frozen=True)
class ServerSpec:
    """What a fork server is: its interpreter, and the import-time variables of its environment."""

    executable: str
    env: dict[str, str]

    @classmethod
    def of(cls, executable: str, env: Mapping[str, str]) -> ServerSpec:
        """The spec of a server running ``executable`` in ``env``."""
        return cls(executable, {k: v for k, v in env.items() if import_time(k)})

    def write(self, path: Path) -> None:
        """To ``path``, whole or not at all."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"executable": self.executable, "env": self.env}))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> ServerSpec:
        """From ``path``; OSError when it is not there, CodecError when it is not a spec."""
        try:
            body = json.loads(read_bounded(path, MAX_SPEC_BYTES))
        except ValueError as exc:
            raise CodecError(f"fork server spec {path}: not JSON ({exc})") from None
        env = body.get("env") if isinstance(body, dict) else None
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("executable"), str)
            or not isinstance(env, dict)
        ):
            raise CodecError(f"fork server spec {path}: expected executable and env")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise CodecError(f"fork server spec {path}: env must map names to strings")
        return cls(body["executable"], env)

    @staticmethod
    def path_for(socket_path: str) -> Path:
        """Where the server at ``socket_path`` describes itself."""
        return Path(socket_path + ".json")


@dataclass(frozen=True)
class ForkRequest:
    """Start ``argv`` in ``cwd`` with exactly ``env`` as its environment."""

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]

    def encode(self) -> bytes:
        """The request as one framed message."""
        return encode_frame_head({"op": "fork", "argv": list(self.argv), "cwd": self.cwd, "env": self.env})


@dataclass(frozen=True)
class ForkReply:
    """One of the server's answers: exactly one field is set."""

    pid: int | None = None
    refused: str | None = None
    exit: int | None = None


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise CodecError(f"fork request: {what} must be a list of strings")
    return value


def decode_request(data: bytes) -> ForkRequest:
    """A request's body, checked; CodecError says which field is wrong."""
    body = decode_header(data)
    if body["op"] != "fork" or set(body) != {"op", "nbytes", "argv", "cwd", "env"} or body["nbytes"]:
        raise CodecError("fork request: expected op 'fork' with argv, cwd and env, and no payload")
    argv = _strings(body["argv"], "argv")
    if not argv or any("\0" in arg for arg in argv):
        raise CodecError("fork request: argv must name a program and hold no NUL bytes")
    cwd, env = body["cwd"], body["env"]
    if not isinstance(cwd, str) or not cwd or "\0" in cwd:
        raise CodecError("fork request: cwd must be a path")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise CodecError("fork request: env must map names to strings")
    if any(not key or "=" in key or "\0" in key or "\0" in value for key, value in env.items()):
        raise CodecError("fork request: an environment variable's name or value is malformed")
    return ForkRequest(tuple(argv), cwd, env)


def decode_reply(data: bytes) -> ForkReply:
    """A reply's body, checked; CodecError when it is none of ``pid``, ``refused`` and ``exit``."""
    body = decode_header(data)
    op = body["op"]
    value = body.get(op)
    if set(body) == {"op", "nbytes", op}:
        if op == "pid" and type(value) is int and value > 0:
            return ForkReply(pid=value)
        if op == "refused" and isinstance(value, str):
            return ForkReply(refused=value)
        if op == "exit" and type(value) is int:
            return ForkReply(exit=value)
    raise CodecError(f"fork server reply: expected pid, refused or exit, got {body!r:.200}")


def split_python_argv(argv: tuple[str, ...]) -> tuple[bool, list[str]]:
    """``python [-u]... rest``: whether ``-u`` was given, and the rest (the script and its arguments)."""
    rest = list(argv[1:])
    while rest and rest[0] == "-u":
        rest.pop(0)
    return len(rest) < len(argv) - 1, rest


def refusal(request: ForkRequest, server: ServerSpec) -> str | None:
    """Why ``server`` cannot start ``request`` as a fork; None when it can."""
    argv = request.argv
    if os.path.abspath(argv[0]) != os.path.abspath(server.executable):
        return f"{argv[0]} is not the fork server's interpreter {server.executable}"
    _, rest = split_python_argv(argv)
    if not rest or rest[0].startswith("-"):
        return "only 'python [-u] script.py [args]' is started from the fork server"
    script = os.path.join(request.cwd, rest[0])
    if not os.path.isfile(script) or zipfile.is_zipfile(script):
        return f"{rest[0]} is not a script file in {request.cwd}"
    for name in sorted(set(request.env) | set(server.env)):
        if import_time(name) and request.env.get(name) != server.env.get(name):
            return f"{name} differs from the fork server's, and it is read when torch is imported"
    return None

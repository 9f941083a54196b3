"""Fuzzing every trust boundary: whatever arrives gets the boundary's own error (or a result), never
another exception and never a hang.

Boundaries and what crosses them:
- the bus: envelope bytes (any peer), transaction bodies (any identity, to the SN's ledger), reads of
  the ledger (any identity), blocks (replicas take them from the sealer), weight chunks and manifests;
- the local socket: frames from the ML program to its SL;
- files: task definitions, SWOP profiles, PEM certificates and keys;
- the shell: swci lines (and what completion and highlighting do with them) and scripts.

`make test` runs every target through hypothesis's engine (``SWARM_FUZZ_EXAMPLES`` cases, 150 by
default, shrinking what fails); `bench/fuzz.py` feeds the same targets more than 100,000 random inputs
through ``fuzz_one_input``, which skips the engine's bookkeeping. ``CASES`` counts the cases each target
really ran. A case that runs longer than ``SWARM_FUZZ_HANG_SECONDS`` fails as a hang (SIGALRM, so
pytest-timeout uses its thread method here).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from certs import CertError
from certs.pki import load_certificates, load_private_key
from contracts.block import BlockError, decode_block, make_block
from contracts.devkeys import DevAuthority
from contracts.machine import apply, genesis_transactions
from contracts.state import EMPTY_STATE, State
from contracts.tx import KINDS, Rejection, Tx, tx_from_envelope
from contracts.views import QUERIES, QueryError, query
from daemons.sl.dataplane import (
    decode_reply,
    decode_request,
    encode_offer,
    encode_request,
    encode_result_request,
)
from swci.commands import Command
from swci.completion import suggest
from swci.errors import ScriptError, SwciSyntaxError
from swci.grammar import REGISTRY
from swci.highlight import fragments
from swci.parser import parse_line, parse_script
from taskdefs import TaskDefError
from taskdefs.profile import parse_swop_profile
from taskdefs.task import parse_task_definition
from wire import CodecError, decode_envelope, encode_envelope, make_envelope
from wire.forks import ForkRequest
from wire.forks import decode_reply as decode_fork_reply
from wire.forks import decode_request as decode_request_to_fork
from wire.frames import decode_header, encode_frame_head, header_length, layout_from_wire, payload_size
from wire.limits import packb
from wire.tensors import (
    MIN_CHUNK_SIZE,
    FlatState,
    decode_chunk,
    encode_chunk,
    layout_of,
    make_manifest,
    manifest_from_body,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("SWARM_FUZZ_EXAMPLES", "150"))
HANG_SECONDS = float(os.environ.get("SWARM_FUZZ_HANG_SECONDS", "10"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
pytestmark = pytest.mark.timeout(max(300, EXAMPLES // 20), method="thread")

CASES: Counter[str] = Counter()
SECONDS: Counter[str] = Counter()
F = TypeVar("F", bound=Callable[..., None])


class Hang(Exception):
    """One case ran longer than HANG_SECONDS."""


@contextlib.contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Raise Hang in this (main) thread when the block runs longer than ``seconds``."""

    def on_alarm(signum: int, frame: object) -> None:
        raise Hang(f"one case ran for more than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def target(name: str) -> Callable[[F], F]:
    """Count the cases of a fuzz target and run each under the hang watchdog."""

    def wrap(check: F) -> F:
        @functools.wraps(check)
        def run(*args: Any, **kwargs: Any) -> None:
            started = time.perf_counter()
            with watchdog(HANG_SECONDS):
                check(*args, **kwargs)
            CASES[name] += 1
            SECONDS[name] += time.perf_counter() - started

        return run  # type: ignore[return-value]

    return wrap


# ------------------------------------------------------------------------------- shared inputs

AUTHORITY = DevAuthority("fuzz")
SIGNERS = {role: AUTHORITY.issue(f"{role}-1", role) for role in ("sl", "sn", "swop", "swci")}
VERIFIER = AUTHORITY.verifier()

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.binary(max_size=40)
    | st.sampled_from(["", "mean", "ALL", "RUN_SWARM", "defaultbb.cqdb.sml.hpe", "sl-1", "a" * 300, "0" * 64])
)
plain = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=6,
)
FIELD_NAMES = sorted({name for spec in KINDS.values() for name in spec.fields} | {"uid", "swop", "role"})
values = st.one_of(scalars, scalars, scalars, plain)  # mostly flat, as real bodies are
bodies = st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=10), values, max_size=6)


def mutate(draw: st.DrawFn, data: bytes) -> bytes:
    """Flip, cut, insert or splice bytes of a valid input."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "splice"]))
        at = draw(st.integers(0, max(len(buf) - 1, 0)))
        if op == "flip" and buf:
            buf[at] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del buf[at : at + draw(st.integers(1, 16))]
        elif op == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            buf = buf[:at] if draw(st.booleans()) else buf[at:]
    return bytes(buf)


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """A valid input, damaged."""
    return mutate(draw, data)


def _state() -> State:
    """A ledger state with a node of every role, a contract, a task and the genesis entities."""
    state, clock = EMPTY_STATE, 1000.0
    setup = [(kind, "sn-1", "sn", body) for kind, body in genesis_transactions("sn-1")]
    setup += [("node.register", f"{role}-1", role, {"host": "h", "address": "10.0.0.1"}) for role in SIGNERS]
    setup += [
        ("contract.create", "swci-1", "swci", {"name": "c1"}),
        ("task.create", "swci-1", "swci", {"name": "t1", "type": "RUN_SWARM", "author": "a"}),
        (
            "taskrunner.enroll",
            "swop-1",
            "swop",
            {"taskrunner": "defaulttaskbb.taskdb.sml.hpe", "capacity": 2},
        ),
        ("contract.join", "sl-1", "sl", {"contract": "c1", "params": {"min_peers": 2}}),
    ]
    for kind, sender, role, body in setup:
        result = apply(state, Tx(kind, sender, role, body, clock), validate_body=lambda *_: None)
        assert not isinstance(result, Rejection), (kind, result.reason)
        state, clock = result, clock + 1
    return state


STATE = _state()


# ------------------------------------------------------------------------------------- the bus


@st.composite
def envelope_bytes(draw: st.DrawFn) -> bytes:
    role = draw(st.sampled_from(sorted(SIGNERS)))
    env = make_envelope(
        draw(st.sampled_from(["tx:contract.join", "req:query", "rep", "event", "manifest"])),
        draw(bodies),
        sender=f"{role}-1",
        role=role,
        signer=SIGNERS[role] if draw(st.booleans()) else None,
    )
    return mutate(draw, encode_envelope(env))


@FUZZ
@given(st.binary(max_size=300) | envelope_bytes())
@target("bus: envelope bytes")
def test_envelopes_decode_or_raise_codec_errors(data: bytes) -> None:
    for verifier in (None, VERIFIER):
        with contextlib.suppress(CodecError):
            env = decode_envelope(data, verifier=verifier, what="fuzz")
            assert isinstance(env.body, dict)


@FUZZ
@given(
    kind=st.sampled_from(sorted(KINDS)) | st.text(max_size=20),
    role=st.sampled_from(["sl", "sn", "swop", "swci", "tool", "broker"]),
    body=bodies,
)
@target("bus: transaction bodies to the ledger")
def test_any_transaction_is_applied_or_rejected(kind: str, role: str, body: dict[str, Any]) -> None:
    env = make_envelope(f"tx:{kind}", body, sender=f"{role}-1", role=role)
    tx = tx_from_envelope(decode_envelope(encode_envelope(env), what="fuzz"), 2000.0)
    if isinstance(tx, Rejection):
        assert tx.reason
        return
    result = apply(STATE, tx, validate_body=lambda *_: None)
    assert isinstance(result, State) or (isinstance(result, Rejection) and result.reason)


@FUZZ
@given(name=st.sampled_from(sorted(QUERIES)) | st.text(max_size=20), args=bodies)
@target("bus: ledger reads")
def test_any_read_is_answered_or_refused(name: str, args: dict[str, Any]) -> None:
    with contextlib.suppress(QueryError):
        answer = query(STATE, name, args)
        packb(answer)  # every answer travels as msgpack


def _a_block() -> bytes:
    env = make_envelope(
        "tx:contract.create", {"name": "c2"}, sender="swci-1", role="swci", signer=SIGNERS["swci"]
    )
    block = make_block(3, b"\x01" * 32, 1234.5, "sn-1", [encode_envelope(env)], signer=SIGNERS["sn"])
    return block.raw


BLOCK = _a_block()


@FUZZ
@given(st.binary(max_size=300) | mutated(BLOCK))
@target("bus: blocks for replicas")
def test_blocks_decode_or_raise_block_errors(data: bytes) -> None:
    with contextlib.suppress(BlockError):
        decode_block(data)


def _a_chunked_state() -> tuple[bytes, dict[str, Any]]:
    specs, total = layout_of([("w", "float32", (64, 8)), ("b", "int64", (3,))])
    flat = FlatState(specs, (np.arange(total) % 251).astype(np.uint8))
    manifest = make_manifest(flat, "sl-1/round-4", chunk_size=MIN_CHUNK_SIZE)
    return encode_chunk(flat, manifest, 0), manifest.body()


CHUNK, MANIFEST = _a_chunked_state()


@FUZZ
@given(st.binary(max_size=300) | mutated(CHUNK))
@target("bus: weight chunks")
def test_chunks_decode_or_raise_codec_errors(data: bytes) -> None:
    with contextlib.suppress(CodecError):
        decode_chunk(data)


@FUZZ
@given(
    st.dictionaries(st.sampled_from(sorted(MANIFEST)), plain, max_size=10).map(lambda d: {**MANIFEST, **d})
    | bodies
)
@target("bus: weight manifests")
def test_manifests_are_checked_or_refused(body: dict[str, Any]) -> None:
    with contextlib.suppress(CodecError):
        manifest_from_body(body)


# ------------------------------------------------------------------------------ the local socket


def framed_body(data: bytes) -> bytes:
    """What a reader of length-prefixed frames (``wire/frames.py``) takes after the prefix: as many bytes
    as it announces (CodecError when it announces too many), of those that are there."""
    return data[4 : 4 + header_length(data[:4].ljust(4, b"\0"))]


FRAME = encode_frame_head({"op": "sync", "layout": [["w", "float32", [2, 2], 0, 16]], "samples": 8}, 16)


@FUZZ
@given(st.binary(max_size=200) | mutated(FRAME))
@target("local socket: frames from the ML program")
def test_frames_decode_or_raise_codec_errors(data: bytes) -> None:
    with contextlib.suppress(CodecError):
        header = decode_header(framed_body(data))
        size = payload_size(header)
        layout_from_wire(header.get("layout"), size, what="fuzz")


# ------------------------------------------------------------------------------- the data plane

DP_REQUESTS = [
    encode_request(bytes(range(32)), "sl-2"),
    encode_result_request("c1", 7, "sl-2"),
    encode_offer(manifest_from_body(MANIFEST), "sl-2"),
]
DP_REPLY = encode_frame_head({"op": "state", "manifest": MANIFEST}, MANIFEST["total"])


@FUZZ
@given(st.binary(max_size=200) | st.sampled_from(DP_REQUESTS).flatmap(mutated))
@target("data plane: requests from peers")
def test_data_plane_requests_decode_or_raise_codec_errors(data: bytes) -> None:
    with contextlib.suppress(CodecError):
        request = decode_request(framed_body(data), max_offer=1 << 20)
        assert request.sender
        asked = [request.digest is not None, request.round is not None, request.offer is not None]
        assert sum(asked) == 1 and (request.round is None) == (request.contract is None)
        assert request.offer is None or request.offer.total <= 1 << 20


@FUZZ
@given(st.binary(max_size=400) | mutated(DP_REPLY))
@target("data plane: replies of peers")
def test_data_plane_replies_decode_or_raise_codec_errors(data: bytes) -> None:
    with contextlib.suppress(CodecError):
        manifest, _ = decode_reply(framed_body(data), max_total=1 << 20)
        assert manifest.total <= 1 << 20


# ------------------------------------------------------------------------------- the fork server

FORK_REQUEST = ForkRequest(("/usr/bin/python3", "model.py", "--x"), "/tmp", {"A": "1", "LANG": "C"}).encode()
FORK_REPLIES = [encode_frame_head(body) for body in ({"op": "pid", "pid": 42}, {"op": "exit", "exit": -15})]


@FUZZ
@given(st.binary(max_size=300) | mutated(FORK_REQUEST))
@target("fork server: requests from SLs")
def test_fork_requests_decode_or_raise_codec_errors(data: bytes) -> None:
    with contextlib.suppress(CodecError):
        request = decode_request_to_fork(framed_body(data))
        assert request.argv
        assert all("\0" not in arg for arg in request.argv)
        assert all(isinstance(value, str) for value in request.env.values())


@FUZZ
@given(st.binary(max_size=100) | st.sampled_from(FORK_REPLIES).flatmap(mutated))
@target("fork server: its replies to an SL")
def test_fork_replies_decode_or_raise_codec_errors(data: bytes) -> None:
    with contextlib.suppress(CodecError):
        reply = decode_fork_reply(framed_body(data))
        assert sum(field is not None for field in (reply.pid, reply.refused, reply.exit)) == 1


# ------------------------------------------------------------------------------------------- files


def _seeds(pattern: str) -> list[str]:
    found = sorted(ROOT.glob(pattern))
    assert found, f"no seed files match {pattern}"
    return [path.read_text() for path in found]


TASK_SEEDS = _seeds("examples/*/swci/taskdefs/*.yaml")
PROFILE_SEEDS = _seeds("examples/*/swop/*.yaml")
YAML_POOL = [
    "",
    " ",
    ":",
    "- ",
    "{",
    "}",
    "[",
    "]",
    "~",
    "null",
    "&a",
    "*a",
    "!!python/object",
    "<<: *a",
    "\t",
    "'",
    '"',
    "#",
    "\n",
    "é",
    "0x1F",
    "1e999",
    "-1",
    "---",
]


@st.composite
def yaml_texts(draw: st.DrawFn, seeds: list[str]) -> str:
    lines = draw(st.sampled_from(seeds)).splitlines()
    for _ in range(draw(st.integers(1, 5))):
        op = draw(st.sampled_from(["delete", "duplicate", "insert", "edit", "indent"]))
        at = draw(st.integers(0, max(len(lines) - 1, 0)))
        if op == "delete" and lines:
            del lines[at]
        elif op == "duplicate" and lines:
            lines.insert(at, lines[at])
        elif op == "insert":
            lines.insert(at, draw(st.sampled_from(YAML_POOL) | st.text(max_size=20)))
        elif op == "indent" and lines:
            lines[at] = " " * draw(st.integers(0, 6)) + lines[at].lstrip()
        elif lines:
            line = lines[at]
            cut = draw(st.integers(0, len(line)))
            lines[at] = line[:cut] + draw(st.sampled_from(YAML_POOL) | st.text(max_size=6)) + line[cut + 1 :]
    return "\n".join(lines)


@FUZZ
@given(yaml_texts(TASK_SEEDS) | st.text(max_size=200))
@target("files: task definitions")
def test_task_definitions_parse_or_raise_located_errors(text: str) -> None:
    with contextlib.suppress(TaskDefError):
        parse_task_definition(text, source="fuzz.yaml")


@FUZZ
@given(yaml_texts(PROFILE_SEEDS) | st.text(max_size=200))
@target("files: SWOP profiles")
def test_profiles_parse_or_raise_located_errors(text: str) -> None:
    with contextlib.suppress(TaskDefError):
        parse_swop_profile(text, source="fuzz.yaml", base_dir="/nonexistent")


def _pem_seed() -> bytes:
    body = "\n".join(["MIIBszCCAVmgAwIBAgIU" + "A" * 44] * 6)
    return f"-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n".encode()


@FUZZ
@given(data=st.binary(max_size=400) | mutated(_pem_seed()))
@target("files: PEM certificates and keys")
def test_pem_files_load_or_raise_cert_errors(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.pem"
        path.write_bytes(data)
        with contextlib.suppress(CertError):
            load_certificates(path)
        with contextlib.suppress(CertError):
            load_private_key(path)


# ------------------------------------------------------------------------------------------ shell

LINE_SEEDS = sorted({example for spec in REGISTRY for example in spec.examples})
WORDS = [
    *sorted(REGISTRY.keywords),
    "0",
    "-1",
    "99999999999999999999",
    "''",
    '"',
    "'",
    "#",
    "\\",
    "\x00",
    "名前",
    "🙂",
]


@st.composite
def swci_lines(draw: st.DrawFn) -> str:
    words = draw(st.sampled_from(LINE_SEEDS)).split(" ")
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(len(words) - 1, 0)))
        replacement = draw(st.sampled_from(WORDS) | st.text(max_size=6))
        op = draw(st.sampled_from(["delete", "insert", "replace"]))
        if op == "delete" and words:
            del words[at]
        elif op == "insert":
            words.insert(at, replacement)
        elif words:
            words[at] = replacement
    return " ".join(words)


@FUZZ
@given(swci_lines() | st.text(max_size=80))
@target("shell: swci lines")
def test_swci_lines_parse_or_raise_syntax_errors(line: str) -> None:
    with contextlib.suppress(SwciSyntaxError):
        assert isinstance(parse_line(line), Command | None)
    for item in suggest(line):
        assert item.text
    if "\n" not in line and "\r" not in line:
        assert "".join(fragment[1] for fragment in fragments(line)) == line


@FUZZ
@given(st.lists(swci_lines() | st.text(max_size=40), max_size=12).map("\n".join))
@target("shell: swci scripts")
def test_swci_scripts_parse_or_raise_syntax_errors(text: str) -> None:
    with contextlib.suppress(ScriptError):
        for line_no, command in parse_script(text, source="fuzz-script"):
            assert line_no >= 1
            assert isinstance(command, Command)


# ----------------------------------------------------------------------------------- the watchdog


def _spin() -> None:
    while True:
        math.sqrt(2.0)


def test_the_watchdog_catches_a_hang() -> None:
    with pytest.raises(Hang), watchdog(0.05):
        time.sleep(2)
    with pytest.raises(Hang), watchdog(0.05):
        _spin()


def test_the_watchdog_catches_a_blocked_read(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(Hang), watchdog(0.05):
        pipe.open("rb")  # blocks until a writer comes: the kind of hang the file limits prevent

    asyncio.run(asyncio.sleep(0))  # the alarm left no state behind

"""The local socket between an ML program and its SL: weights through the socket or a shared buffer.

A real ``LocalServer`` (the SL's end) and a real ``SLLink`` (the ML program's end) in one process, with a
stand-in session that records what it got and answers with a fixed model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from daemons.sl.buffers import MODEL_BUFFERS
from daemons.sl.local_server import LocalServer
from swarmlearning.client.link import LinkError, SLLink
from tests.conftest import SmallDisk
from wire.errors import CodecError
from wire.frames import layout_to_wire
from wire.tensors import FlatState

MERGED = FlatState.from_arrays({"w": np.arange(1000, dtype=np.float32)})


class StandInSession:
    """Answers every request with MERGED (``hello`` with nothing); keeps the weights it was sent."""

    def __init__(self) -> None:
        self.received: list[np.ndarray | None] = []

    async def handle(self, header: dict[str, Any], payload: np.ndarray | None) -> Any:
        self.received.append(None if payload is None else payload.copy())
        if header["op"] == "hello":
            return {"op": "ok"}, None
        return {"op": "ok", "layout": layout_to_wire(MERGED.specs)}, MERGED


def _with_server(tmp_path: Path, client: Callable[[SLLink], Any]) -> tuple[Any, StandInSession, int]:
    """Run ``client`` against a LocalServer; its result, the session, the connections served."""
    session = StandInSession()

    async def main() -> tuple[Any, int]:
        async with LocalServer(tmp_path / "sl.sock", session.handle) as server:
            link = SLLink(str(tmp_path / "sl.sock"), connect_timeout=5)
            try:
                result = await asyncio.to_thread(client, link)
            finally:
                link.close()
        return result, server.connections

    result, connections = asyncio.run(main())
    return result, session, connections


def test_weights_go_through_the_socket_without_a_shared_buffer(tmp_path: Path) -> None:
    mine = np.full(MERGED.total, 7, dtype=np.uint8)

    def client(link: SLLink) -> Any:
        hello, _ = link.call("hello", {})
        reply, data = link.call("sync", {}, mine)
        return hello, reply, data, link.last

    (hello, reply, data, times), session, _ = _with_server(tmp_path, client)
    assert "shm_next" not in hello  # none asked for
    sent = session.received[1]
    assert sent is not None and np.array_equal(sent, mine)
    assert data is not None and np.array_equal(data, MERGED.buffer)
    assert "shm" not in reply
    assert set(reply["sl_s"]) == {"read", "handle"}  # the SL's account of the call
    assert min(times.send, times.wait, times.receive) >= 0


def test_weights_go_through_shared_buffers_both_ways(tmp_path: Path) -> None:
    def client(link: SLLink) -> Any:
        link.share(MERGED.total)
        hello, _ = link.call("hello", {"shm_bytes": MERGED.total})
        seen = []
        for value in (3, 5):
            lent = link.lent
            assert lent is not None
            lent.array[:] = value  # the model, flattened straight into the buffer
            reply, data = link.call("sync", {}, lent.array)
            assert data is not None
            seen.append((link.is_shared(data), np.array_equal(data, MERGED.buffer), "shm_next" in reply))
        return hello, seen, sorted(p.name for p in tmp_path.iterdir())

    (hello, seen, during), session, _ = _with_server(tmp_path, client)
    assert "shm_next" in hello and "shm" not in hello
    assert seen == [(True, True, True), (True, True, True)]  # the merged model came back in a shared buffer
    assert [r[0] for r in session.received[1:] if r is not None] == [3, 5]  # the SL got each sync's
    assert all(r is not None and r.nbytes == MERGED.total for r in session.received[1:])
    # the names stay while the program runs (the SL's peers on this host copy models from them)
    assert during[0] == "sl.sock" and len(during) == 4  # the buffers lent (2) and answered in (1)
    assert all(name.startswith("weights-") for name in during[1:])
    assert [p.name for p in tmp_path.iterdir()] == ["sl.sock"]  # and the buffers are gone


class HoldingSession:
    """Like the SL's round engine: keeps every sync's weights (the rows it serves) and answers with a
    merge in a buffer of its own pool."""

    def __init__(self) -> None:
        self.held: list[np.ndarray] = []
        self.answers: list[np.ndarray] = []
        self.row_files: list[str] = []  # the shared files of both, as the SL's pool names them
        self.answer_files: list[str] = []

    async def handle(self, header: dict[str, Any], payload: np.ndarray | None) -> Any:
        if header["op"] == "hello":
            return {"op": "ok"}, None
        assert payload is not None
        self.held.append(payload)
        merged = MODEL_BUFFERS.take(MERGED.total)
        merged[:] = payload[0] + 100
        self.answers.append(merged)
        self.row_files.append(str(MODEL_BUFFERS.file_of(payload)))
        self.answer_files.append(str(MODEL_BUFFERS.file_of(merged)))
        return {"op": "ok", "layout": layout_to_wire(MERGED.specs)}, FlatState(MERGED.specs, merged)


def test_weights_already_in_a_shared_buffer_are_named_and_the_lent_buffer_is_never_one_the_sl_holds(
    tmp_path: Path,
) -> None:
    session = HoldingSession()

    def client(link: SLLink) -> Any:
        link.share(MERGED.total)
        link.call("hello", {"shm_bytes": MERGED.total})
        got = []
        for value in range(1, 6):
            lent = link.lent
            assert lent is not None
            lent.array[:] = value
            reply, data = link.call("sync", {}, lent.array)
            assert data is not None
            got.append((int(data[0]), reply["shm"], str(lent.path)))
        return got

    async def main() -> Any:
        async with LocalServer(tmp_path / "sl.sock", session.handle):
            link = SLLink(str(tmp_path / "sl.sock"), connect_timeout=5)
            try:
                return await asyncio.to_thread(client, link)
            finally:
                link.close()

    got = asyncio.run(main())
    assert [value for value, _, _ in got] == [101, 102, 103, 104, 105]
    assert [int(row[0]) for row in session.held] == [1, 2, 3, 4, 5]  # no row was written over
    assert len({a.ctypes.data for a in session.held + session.answers}) == 10  # ten distinct buffers
    answered, lent = [name for _, name, _ in got], [name for _, _, name in got]
    assert answered == session.answer_files  # each answer came in the buffer merged into: no copy
    assert lent == session.row_files  # each lent buffer is the row the SL then held
    assert len(set(answered + lent)) == 10  # so none was lent while the SL held it


def test_a_request_naming_a_buffer_that_was_not_lent_drops_the_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def client(link: SLLink) -> Any:
        link.share(MERGED.total)
        link.call("hello", {"shm_bytes": MERGED.total})
        with pytest.raises(LinkError, match="lost the SL"):
            link.call("sync", {"shm": "/etc/passwd"})
        return True

    assert _with_server(tmp_path, client)[0] is True
    assert "which is not the one lent" in caplog.text


def test_a_hello_asking_for_an_impossible_buffer_gets_none(tmp_path: Path) -> None:
    def client(link: SLLink) -> Any:
        return link.call("hello", {"shm_bytes": -1})[0], link.call("hello", {"shm_bytes": True})[0]

    (first, second), _, _ = _with_server(tmp_path, client)
    assert "shm_next" not in first and "shm_next" not in second


def test_a_buffer_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    def client(link: SLLink) -> Any:
        link.share(MERGED.total + 64)  # the ML program thinks its model bigger than the SL's buffers
        link.call("hello", {"shm_bytes": MERGED.total})
        return link.lent, link.refused

    lent, refused = _with_server(tmp_path, client)[0]
    assert lent is None and refused is not None and "holds" in refused  # weights go through the socket


def test_when_memory_runs_out_the_weights_go_through_the_socket_and_still_arrive(
    small_disk: SmallDisk, caplog: pytest.LogCaptureFixture
) -> None:
    """An 8 MiB /dev/shm and a 5 MiB model: the first buffer fits, no second one does."""
    big = FlatState.from_arrays({"w": np.arange(5 * (1 << 20) // 4, dtype=np.float32)})

    async def handle(header: dict[str, Any], payload: np.ndarray | None) -> Any:
        if header["op"] == "hello":
            return {"op": "ok"}, None
        assert payload is not None
        merged = big.buffer.copy()
        merged[:4] = payload[:4]  # the answer shows which weights the SL got
        return {"op": "ok", "layout": layout_to_wire(big.specs)}, FlatState(big.specs, merged)

    def client(link: SLLink) -> Any:
        link.share(big.total)
        link.call("hello", {"shm_bytes": big.total})
        got = []
        for value in (1, 2, 3):
            assert (link.lent is not None) == (value == 1)
            mine = link.lent.array if link.lent is not None else np.empty(big.total, dtype=np.uint8)
            mine[:] = value
            reply, data = link.call("sync", {}, mine)
            assert data is not None
            got.append((int(data[0]), data[4:].tobytes() == big.buffer[4:].tobytes(), "shm" in reply))
        return got

    async def main() -> Any:
        async with LocalServer(small_disk.path / "sl.sock", handle):
            link = SLLink(str(small_disk.path / "sl.sock"), connect_timeout=5)
            try:
                return await asyncio.to_thread(client, link)
            finally:
                link.close()

    got = asyncio.run(main())
    assert [(value, whole) for value, whole, _ in got] == [(1, True), (2, True), (3, True)]
    # the first answer found no room; later ones come in the one file that fit, once the SL let go of the
    # first request's weights in it, and the requests come through the socket (nothing more to lend)
    assert [via_shared for _, _, via_shared in got] == [False, True, True]
    assert "no more weight buffers of 5242880 bytes shared" in caplog.text
    assert [p.name for p in small_disk.path.iterdir()] == ["sl.sock"]


def test_the_ml_program_maps_shared_buffers_only_beside_the_sls_socket(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "weights-1").write_bytes(bytes(MERGED.total))  # a file of the right size, elsewhere

    def client(link: SLLink) -> Any:
        link.share(MERGED.total)
        link.call("hello", {"shm_bytes": MERGED.total})
        with pytest.raises(CodecError, match="outside its socket's directory"):
            link._attach(str(elsewhere / "weights-1"))
        return link.lent is not None

    assert _with_server(tmp_path, client)[0] is True  # the SL's own buffer, beside the socket, is mapped

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

from daemons.sl.local_server import LocalServer
from swarmlearning.client.link import SLLink
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
    assert "shm_path" not in hello  # none asked for
    sent = session.received[1]
    assert sent is not None and np.array_equal(sent, mine)
    assert data is not None and np.array_equal(data, MERGED.buffer)
    assert "shm" not in reply
    assert set(reply["sl_s"]) == {"read", "handle"}  # the SL's account of the call
    assert min(times.send, times.wait, times.receive) >= 0


def test_weights_go_through_the_shared_buffer_both_ways(tmp_path: Path) -> None:
    def client(link: SLLink) -> Any:
        hello, _ = link.call("hello", {"shm_bytes": MERGED.total})
        shared = link.attach_shared(hello["shm_path"], MERGED.total)
        shared.remove()
        seen = []
        for value in (3, 5):
            shared.array[:] = value  # the model, flattened straight into the buffer
            reply, data = link.call("sync", {}, shared.array)
            seen.append((reply.get("shm"), data is shared.array, np.array_equal(shared.array, MERGED.buffer)))
        return hello["shm_path"], seen

    (path, seen), session, _ = _with_server(tmp_path, client)
    assert seen == [(True, True, True), (True, True, True)]  # the merged model came back in the buffer
    assert [r[0] for r in session.received[1:] if r is not None] == [3, 5]  # the SL got each sync's
    assert all(r is not None and r.nbytes == MERGED.total for r in session.received[1:])
    assert not Path(path).exists()
    assert [p.name for p in tmp_path.iterdir()] == ["sl.sock"]  # the buffer is gone


def test_a_hello_asking_for_an_impossible_buffer_gets_none(tmp_path: Path) -> None:
    def client(link: SLLink) -> Any:
        return link.call("hello", {"shm_bytes": -1})[0], link.call("hello", {"shm_bytes": True})[0]

    (first, second), _, _ = _with_server(tmp_path, client)
    assert "shm_path" not in first and "shm_path" not in second


def test_a_buffer_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    def client(link: SLLink) -> Any:
        hello, _ = link.call("hello", {"shm_bytes": MERGED.total})
        with pytest.raises(ValueError, match="holds"):
            link.attach_shared(hello["shm_path"], MERGED.total + 64)
        return True

    assert _with_server(tmp_path, client)[0] is True

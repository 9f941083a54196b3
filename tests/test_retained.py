"""``daemons.bus.retained.RetainedPresence``: the presence messages a bus session hands a subscription
that shares the broker's filter (the broker sends retained messages only on SUBSCRIBE)."""

from __future__ import annotations

from daemons.bus.endpoint import Message
from daemons.bus.retained import RetainedPresence
from daemons.bus.topics import Topics

TOPICS = Topics("net", "sl-1", "sl-1")


def _presence(uid: str, payload: bytes, *, retain: bool = False) -> Message:
    return Message(TOPICS.presence(uid), payload, retain)


def test_the_latest_presence_of_each_node_is_handed_over_as_retained() -> None:
    kept = RetainedPresence(TOPICS.presence())
    kept.note(_presence("sn-1", b"online", retain=True))
    kept.note(_presence("sl-2", b"online", retain=True))
    kept.note(_presence("sn-1", b"offline"))  # live: the broker's retained message from now on
    kept.note(Message(TOPICS.event("sn-1", "block"), b"not a presence"))
    assert list(kept.matching(TOPICS.presence())) == [
        _presence("sl-2", b"online", retain=True),
        _presence("sn-1", b"offline", retain=True),
    ]
    assert list(kept.matching(TOPICS.presence("sl-2"))) == [_presence("sl-2", b"online", retain=True)]
    assert list(kept.matching(TOPICS.events("sn-1", "block"))) == []


def test_an_empty_presence_clears_and_the_oldest_go_past_the_bound() -> None:
    kept = RetainedPresence(TOPICS.presence(), max_kept=3)
    for uid in ("a", "b", "c", "d"):
        kept.note(_presence(uid, uid.encode()))
    assert [m.payload for m in kept.matching(TOPICS.presence())] == [b"b", b"c", b"d"]
    kept.note(_presence("c", b""))
    assert [m.payload for m in kept.matching(TOPICS.presence())] == [b"b", b"d"]
    assert len(kept) == 2

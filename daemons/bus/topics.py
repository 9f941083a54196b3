"""Every topic string of the bus, built in one place: ``swarm/v1/<network>/...``.

A process publishes only under its namespace ``nodes/<identity>/<uid>/``, where ``identity`` is its
certificate's CN and ``uid`` its node uid (the same, except for nodes an SL identity vouches for). The
broker ACL lets an identity write only under ``nodes/<its CN>/#``, so every node an identity vouches for
lives inside that identity's part of the tree. Topics of other nodes are filters with ``+`` for the
identity level; :meth:`daemons.bus.Bus.open` checks both levels against the envelope.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from wire.envelope import check_uid

__all__ = ["PREFIX", "Topics", "namespace_of", "sender_of", "topic_matches"]

PREFIX = "swarm/v1"


_KEPT_TOPIC_CHARS = 512  # longer than any topic of ours: a peer's odd topic is matched, not kept


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT wildcard match of ``topic`` against ``topic_filter`` (``+`` one level, ``#`` the rest).

    The answers for the last few thousand pairs are kept: a session matches every message against each
    of its filters, and in a sync round the same few topics (a reply, a round event) come again and again.
    """
    if len(topic) > _KEPT_TOPIC_CHARS or len(topic_filter) > _KEPT_TOPIC_CHARS:
        return _matches(topic_filter, topic)
    return _kept_matches(topic_filter, topic)


def _matches(topic_filter: str, topic: str) -> bool:
    f_parts = topic_filter.split("/")
    t_parts = topic.split("/")
    for i, part in enumerate(f_parts):
        if part == "#":
            return True
        if i >= len(t_parts) or (part not in ("+", t_parts[i])):
            return False
    return len(f_parts) == len(t_parts)


_kept_matches = lru_cache(maxsize=4096)(_matches)


def namespace_of(topic: str) -> tuple[str, str] | None:
    """``(identity, uid)`` of the namespace ``topic`` is in (``.../nodes/<identity>/<uid>/...``), or None."""
    parts = topic.split("/")
    if len(parts) >= 6 and parts[3] == "nodes":
        return parts[4], parts[5]
    return None


def sender_of(topic: str) -> str | None:
    """The uid whose namespace ``topic`` is in, or None."""
    owner = namespace_of(topic)
    return None if owner is None else owner[1]


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic builder for one swarm network, as seen by the process ``uid`` of ``identity``.

    Without a ``uid``, or for another uid, the namespace is a filter (``nodes/+/<uid>``).
    """

    network: str
    uid: str | None = None
    identity: str | None = None

    def __post_init__(self) -> None:
        check_uid(self.network, what="network name")

    @property
    def root(self) -> str:
        """``swarm/v1/<network>``."""
        return f"{PREFIX}/{self.network}"

    def node(self, uid: str) -> str:
        """The namespace of ``uid``: exact for this process, a filter over identities for others."""
        if uid == "+":
            return f"{self.root}/nodes/+/+"
        identity = (self.identity or uid) if uid == self.uid else "+"
        return f"{self.root}/nodes/{identity}/{check_uid(uid)}"

    def own(self, identity: str, uid: str) -> str:
        """The exact namespace of ``uid`` under ``identity`` (for tests and tools)."""
        return f"{self.root}/nodes/{check_uid(identity)}/{check_uid(uid)}"

    def presence(self, uid: str = "+") -> str:
        """Retained presence of ``uid`` (``+`` for everyone's)."""
        return f"{self.node(uid)}/status"

    def request(self, sender: str, target: str) -> str:
        """Where ``sender`` publishes requests for ``target``."""
        return f"{self.node(sender)}/req/{check_uid(target)}"

    def requests_to(self, target: str) -> str:
        """Filter for every request addressed to ``target``."""
        return f"{self.root}/nodes/+/+/req/{check_uid(target)}"

    def reply(self, sender: str, target: str) -> str:
        """Where ``sender`` publishes replies for ``target``."""
        return f"{self.node(sender)}/rep/{check_uid(target)}"

    def replies_to(self, target: str) -> str:
        """Filter for every reply addressed to ``target``."""
        return f"{self.root}/nodes/+/+/rep/{check_uid(target)}"

    def event(self, sender: str, *path: str) -> str:
        """An event published by ``sender`` (the SN): ``nodes/<sn>/<sn>/ev/<path...>``."""
        return "/".join([f"{self.node(sender)}/ev", *path])

    def events(self, sender: str = "+", *path: str) -> str:
        """Filter for events of ``sender`` under ``path`` (all events when ``path`` is empty)."""
        return "/".join([f"{self.node(sender)}/ev", *(path or ("#",))])

    def blob_chunks(self, holder: str, transfer: str) -> str:
        """Chunks of transfer ``transfer`` published by ``holder``."""
        return f"{self.node(holder)}/blob/{check_uid(transfer, what='transfer id')}/c"

    def blob_manifest(self, holder: str, transfer: str) -> str:
        """The manifest of transfer ``transfer`` published by ``holder``."""
        return f"{self.node(holder)}/blob/{check_uid(transfer, what='transfer id')}/m"

    def blob(self, holder: str, transfer: str) -> str:
        """Filter for chunks and manifest of one transfer."""
        return f"{self.node(holder)}/blob/{check_uid(transfer, what='transfer id')}/+"

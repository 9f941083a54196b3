"""Every topic string of the bus, built in one place: ``swarm/v1/<network>/...``.

A process publishes only under ``nodes/<its uid>/``; the broker ACL enforces exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass

from wire.envelope import check_uid

__all__ = ["PREFIX", "Topics", "sender_of", "topic_matches"]

PREFIX = "swarm/v1"


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT wildcard match of ``topic`` against ``topic_filter`` (``+`` one level, ``#`` the rest)."""
    f_parts = topic_filter.split("/")
    t_parts = topic.split("/")
    for i, part in enumerate(f_parts):
        if part == "#":
            return True
        if i >= len(t_parts) or (part not in ("+", t_parts[i])):
            return False
    return len(f_parts) == len(t_parts)


def sender_of(topic: str) -> str | None:
    """The uid whose namespace ``topic`` is in (``.../nodes/<uid>/...``), or None."""
    parts = topic.split("/")
    if len(parts) >= 5 and parts[3] == "nodes":
        return parts[4]
    return None


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic builder for one swarm network."""

    network: str

    def __post_init__(self) -> None:
        check_uid(self.network, what="network name")

    @property
    def root(self) -> str:
        """``swarm/v1/<network>``."""
        return f"{PREFIX}/{self.network}"

    def node(self, uid: str) -> str:
        """The namespace ``uid`` may publish under."""
        return f"{self.root}/nodes/{check_uid(uid)}"

    def presence(self, uid: str = "+") -> str:
        """Retained presence of ``uid`` (``+`` for everyone's)."""
        return f"{self.root}/nodes/{uid}/status"

    def request(self, sender: str, target: str) -> str:
        """Where ``sender`` publishes requests for ``target``."""
        return f"{self.node(sender)}/req/{check_uid(target)}"

    def requests_to(self, target: str) -> str:
        """Filter for every request addressed to ``target``."""
        return f"{self.root}/nodes/+/req/{check_uid(target)}"

    def reply(self, sender: str, target: str) -> str:
        """Where ``sender`` publishes replies for ``target``."""
        return f"{self.node(sender)}/rep/{check_uid(target)}"

    def replies_to(self, target: str) -> str:
        """Filter for every reply addressed to ``target``."""
        return f"{self.root}/nodes/+/rep/{check_uid(target)}"

    def event(self, sender: str, *path: str) -> str:
        """An event published by ``sender`` (the SN): ``nodes/<sn>/ev/<path...>``."""
        return "/".join([f"{self.node(sender)}/ev", *path])

    def events(self, sender: str = "+", *path: str) -> str:
        """Filter for events of ``sender`` under ``path`` (all events when ``path`` is empty)."""
        return "/".join([f"{self.root}/nodes/{sender}/ev", *(path or ("#",))])

    def blob_chunks(self, holder: str, transfer: str) -> str:
        """Chunks of transfer ``transfer`` published by ``holder``."""
        return f"{self.node(holder)}/blob/{check_uid(transfer, what='transfer id')}/c"

    def blob_manifest(self, holder: str, transfer: str) -> str:
        """The manifest of transfer ``transfer`` published by ``holder``."""
        return f"{self.node(holder)}/blob/{check_uid(transfer, what='transfer id')}/m"

    def blob(self, holder: str, transfer: str) -> str:
        """Filter for chunks and manifest of one transfer."""
        return f"{self.node(holder)}/blob/{check_uid(transfer, what='transfer id')}/+"

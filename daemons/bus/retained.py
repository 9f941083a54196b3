"""The presence messages a bus session has seen, for subscriptions that share the broker's.

MQTT sends a topic's retained message only in answer to a SUBSCRIBE. A bus session sends one SUBSCRIBE
per filter and connection, so a second subscription to a filter it already holds (an SN looked for
while the node's own presence watcher runs, a sealer's liveness started while a kept filter stays) would
never see the retained ``online`` of the nodes already up. The session keeps the latest presence message
of every node it hears of and hands a new subscription those its filter matches, as the broker would.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from daemons.bus.endpoint import Message
from daemons.bus.topics import topic_matches

__all__ = ["MAX_KEPT", "RetainedPresence"]

MAX_KEPT = 65_536  # nodes; past that the oldest are forgotten (a subscription made anew gets them all)


class RetainedPresence:
    """The latest presence message per topic under ``presence_filter`` (``Topics.presence()``)."""

    def __init__(self, presence_filter: str, max_kept: int = MAX_KEPT) -> None:
        self._filter = presence_filter
        self._max_kept = max_kept
        self._latest: OrderedDict[str, Message] = OrderedDict()

    def note(self, message: Message) -> None:
        """Keep ``message`` if it is a presence message (retained or live: every presence is published
        retained, so a live one is the broker's retained message from now on); an empty one clears."""
        if not topic_matches(self._filter, message.topic):
            return
        self._latest.pop(message.topic, None)
        if message.payload:
            self._latest[message.topic] = Message(message.topic, message.payload, True)
            if len(self._latest) > self._max_kept:
                self._latest.popitem(last=False)

    def matching(self, topic_filter: str) -> Iterator[Message]:
        """The kept messages a new subscription to ``topic_filter`` would get from the broker, as retained."""
        for topic, message in list(self._latest.items()):
            if topic_matches(topic_filter, topic):
                yield message

    def __len__(self) -> int:
        return len(self._latest)

"""MQTT topic filters as the bus matches them (``daemons/bus/topics.py``)."""

from __future__ import annotations

import pytest

from daemons.bus.topics import _kept_matches, topic_matches


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("swarm/v1/n/nodes/+/+/ev/round/c", "swarm/v1/n/nodes/sn-1/sn-1/ev/round/c", True),
        ("swarm/v1/n/nodes/+/+/ev/round/c", "swarm/v1/n/nodes/sn-1/sn-1/ev/round/c2", False),
        ("swarm/v1/n/nodes/+/+/ev/round/c", "swarm/v1/n/nodes/sn-1/ev/round/c", False),
        ("swarm/v1/n/nodes/sl-1/sl1/blob/#", "swarm/v1/n/nodes/sl-1/sl1/blob/x/c", True),
        ("swarm/v1/n/nodes/sl-1/sl1/blob/#", "swarm/v1/n/nodes/sl-1/sl2/blob/x/c", False),
        ("swarm/v1/n/#", "swarm/v1/n", True),
        ("a/+", "a", False),
        ("a/b", "a/b/c", False),
    ],
)
def test_topic_filters_match_as_mqtt_says_asked_once_or_again(
    topic_filter: str, topic: str, expected: bool
) -> None:
    assert topic_matches(topic_filter, topic) is expected
    assert topic_matches(topic_filter, topic) is expected  # the kept answer is the same


def test_a_long_topic_is_matched_but_not_kept() -> None:
    """A peer may publish under its namespace with levels of any length; only short topics are kept, so
    such messages cannot fill the session's memory with kept answers."""
    long_uid = "x" * 60_000
    topic = f"swarm/v1/n/nodes/sl-1/{long_uid}/req/sn-1"
    kept_before = _kept_matches.cache_info().currsize
    assert topic_matches("swarm/v1/n/nodes/+/+/req/sn-1", topic) is True
    assert topic_matches("swarm/v1/n/nodes/+/+/rep/sn-1", topic) is False
    assert _kept_matches.cache_info().currsize == kept_before

"""Where the broker is and how to connect to it."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["DEFAULT_PORT", "BrokerAddress", "BusConfig", "publish_qos_from_env", "subscribe_qos_from_env"]

DEFAULT_PORT = 30304  # the reference system's SN API port; our SN's broker listens there


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """``mqtt://host:port`` or ``mqtts://host:port``, with the other nodes of a broker cluster.

    ``alternates`` are tried in turn when this broker cannot be reached; the address prints (and
    parses) as a comma-separated list, so it travels through command lines unchanged.
    """

    host: str
    port: int = DEFAULT_PORT
    tls: bool = False
    alternates: tuple[BrokerAddress, ...] = ()

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        """Parse ``mqtt[s]://host[:port]`` (or a bare ``host[:port]``), or a comma-separated list of
        them (a broker cluster); raise ValueError if invalid."""
        first, *others = [part.strip() for part in url.split(",")]
        if others:
            head = cls.parse(first)
            return cls(head.host, head.port, head.tls, tuple(cls.parse(o) for o in others))
        return cls._parse_one(url.strip())

    @classmethod
    def _parse_one(cls, url: str) -> BrokerAddress:
        text = url if "://" in url else f"mqtt://{url}"
        parts = urlsplit(text)
        if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise ValueError(f"broker address {url!r}: scheme must be mqtt:// or mqtts://")
        if not parts.hostname or not url:
            raise ValueError(f"broker address {url!r} has no host")
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise ValueError(f"broker address {url!r} has an invalid port") from None
        return cls(parts.hostname, port, parts.scheme in ("mqtts", "ssl"))

    @property
    def addresses(self) -> tuple[BrokerAddress, ...]:
        """Every broker of the list, each on its own."""
        return (BrokerAddress(self.host, self.port, self.tls), *self.alternates)

    def with_tls(self) -> BrokerAddress:
        """The same list, every address with TLS."""
        return BrokerAddress(self.host, self.port, True, tuple(a.with_tls() for a in self.alternates))

    def __str__(self) -> str:
        return ",".join(f"{'mqtts' if a.tls else 'mqtt'}://{a.host}:{a.port}" for a in self.addresses)


def subscribe_qos_from_env(env: Mapping[str, str] | None = None) -> int:
    """``SWARM_SUBSCRIBE_QOS`` (0 or 1, default 1): the QoS of every subscription.

    0 for a NATS cluster's MQTT: there every QoS-1 subscription is a replicated JetStream consumer,
    and re-creating hundreds of them after a node dies stalls the cluster; request/reply resends and
    transfers re-fetch, so nothing relies on the broker's redelivery.
    """
    return _qos_from_env("SWARM_SUBSCRIBE_QOS", env)


def publish_qos_from_env(env: Mapping[str, str] | None = None) -> int:
    """``SWARM_PUBLISH_QOS`` (0 or 1, default 1): the QoS of every publish, the presence and its will too.

    0 for a NATS cluster's MQTT: there a QoS-1 publish is stored in a replicated JetStream stream before
    the broker acknowledges it, and while a dead node's stream leaders are replaced (seconds) the broker
    closes the connection of every client whose publish was not stored within 5 s (their wills fire);
    at QoS 0 a message only travels (a retained presence is still kept). Requests are resent until
    answered and views read again after a quiet spell, so a message lost with a connection costs a
    resend, as one lost by a QoS-0 subscription does.
    """
    return _qos_from_env("SWARM_PUBLISH_QOS", env)


def _qos_from_env(name: str, env: Mapping[str, str] | None) -> int:
    text = (os.environ if env is None else env).get(name, "1").strip()
    if text not in ("0", "1"):
        raise ValueError(f"{name}={text!r} must be 0 or 1")
    return int(text)


def keepalive_from_env(env: Mapping[str, str] | None = None) -> int:
    """``SWARM_KEEPALIVE`` (seconds, default 10): the MQTT keepalive; a node silent for 1.5 times that
    (frozen, cut off) is dropped by the broker, which publishes its will (its presence turns offline)."""
    text = (os.environ if env is None else env).get("SWARM_KEEPALIVE", "10").strip()
    if not text.isdigit() or not 1 <= int(text) <= 3600:
        raise ValueError(f"SWARM_KEEPALIVE={text!r} must be a number of seconds from 1 to 3600")
    return int(text)


@dataclass(frozen=True, slots=True)
class BusConfig:
    """Connection settings of one bus session.

    ``uid`` is the node uid; ``identity`` the certificate's CN when it differs (a node that an SL
    identity vouches for; None: the uid is the identity); ``tls`` a client context from
    ``certs.tls.client_context``. Timeouts are in seconds; ``connect_timeout`` is each broker's wait
    for CONNACK; opening a session looks for its brokers that long, and on until each broker of its list
    has had its turn (``connect_timeout`` each at most), and fails at once when each of them refused it
    for a reason another attempt cannot change (certificates, TLS or not).
    """

    broker: BrokerAddress
    uid: str
    role: str
    network: str = "swarm"
    identity: str | None = None
    tls: ssl.SSLContext | None = field(default=None, compare=False)
    keepalive: int = field(default_factory=keepalive_from_env)
    connect_timeout: float = 10.0
    request_timeout: float = 10.0
    publish_timeout: float = 30.0
    backoff_base: float = 0.2
    backoff_cap: float = 2.0  # reconnects: a broker that is back is found within ~2 s
    first_connect_poll: float = 0.1  # before the first connection: a broker starting beside us
    subscribe_qos: int = field(default_factory=subscribe_qos_from_env)
    publish_qos: int = field(default_factory=publish_qos_from_env)

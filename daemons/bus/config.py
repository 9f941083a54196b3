"""Where the broker is and how to connect to it."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["DEFAULT_PORT", "BrokerAddress", "BusConfig"]

DEFAULT_PORT = 30304  # the reference system's SN API port; our SN's broker listens there


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """``mqtt://host:port`` or ``mqtts://host:port``."""

    host: str
    port: int = DEFAULT_PORT
    tls: bool = False

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        """Parse ``mqtt[s]://host[:port]`` (or a bare ``host[:port]``); raise ValueError if invalid."""
        text = url if "://" in url else f"mqtt://{url}"
        parts = urlsplit(text)
        if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise ValueError(f"broker address {url!r}: scheme must be mqtt:// or mqtts://")
        if not parts.hostname:
            raise ValueError(f"broker address {url!r} has no host")
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise ValueError(f"broker address {url!r} has an invalid port") from None
        return cls(parts.hostname, port, parts.scheme in ("mqtts", "ssl"))

    def __str__(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class BusConfig:
    """Connection settings of one bus session.

    ``uid`` is the node uid; ``identity`` the certificate's CN when it differs (a node that an SL
    identity vouches for; None: the uid is the identity); ``tls`` a client context from
    ``certs.tls.client_context``. Timeouts are in seconds.
    """

    broker: BrokerAddress
    uid: str
    role: str
    network: str = "swarm"
    identity: str | None = None
    tls: ssl.SSLContext | None = field(default=None, compare=False)
    keepalive: int = 10
    connect_timeout: float = 10.0
    request_timeout: float = 10.0
    publish_timeout: float = 30.0
    max_queued_messages: int = 10_000
    backoff_base: float = 0.2
    backoff_cap: float = 5.0

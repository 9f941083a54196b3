"""What a managed broker needs: address, limits, and (optionally) certificates for mutual TLS."""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_MAX_PACKET", "BrokerSettings", "BrokerTLS", "free_port"]

# Largest envelope (8 MiB) plus headroom; set explicitly because mosquitto 2.1 defaults to 2 MB
# and a too-large packet only shows up as a disconnect.
DEFAULT_MAX_PACKET = 8 * 1024 * 1024 + 64 * 1024


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class BrokerTLS:
    """Mutual TLS: the broker's certificate and key, and the swarm CA that client certificates need."""

    ca: Path
    cert: Path
    key: Path

    def check(self) -> None:
        """Raise FileNotFoundError naming the first missing file."""
        for what, path in (
            ("CA certificate", self.ca),
            ("certificate", self.cert),
            ("key", self.key),
        ):
            if not path.is_file():
                raise FileNotFoundError(f"broker TLS {what} {path} does not exist")


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """A broker to run: ``port`` 0 picks a free one; ``workdir`` holds config, ACL and log."""

    workdir: Path
    host: str = "127.0.0.1"
    port: int = 0
    max_packet_size: int = DEFAULT_MAX_PACKET
    tls: BrokerTLS | None = None

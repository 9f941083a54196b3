"""Ledger benchmark: sealed tx/s with signature checks, tx/s through ``swarm sn`` over the bus, SN start time.

Rows (every baseline is measured in the same run):

- **seal in process**: ``bench.ledger_core``'s workload (8 SLs checking in, closing, merging and reporting
  progress, every envelope signed with an X.509/ECDSA P-256 identity from ``certs.init_swarm``) sealed in
  blocks of 200 with every signature verified, building a 100,000-transaction chain. Baseline: decoding
  and verifying the same envelopes without the ledger.
- **submit over the bus**: a ``swarm sn --sentinel`` with sn-1's certificates (its mosquitto requires
  mutual TLS); client *processes* (sl-1..), each one ``Bus`` + ``LedgerClient`` keeping a number of
  signed ``contract.progress`` submits in flight, released together; acknowledged tx/s over the whole
  run (first start to last ack). Two shapes (``BUS_RUNS``): 4 processes x 16 in flight (SLs of a swarm)
  and 1 process x 64 in flight (less CPU taken from the SN on a small machine). The SN runs with its
  check-in hold off (``SWARM_SN_CHECKIN_HOLD=0``): by default it holds a progress report up to 0.5 s for
  the check-ins of its round (``daemons/sn/sealer.py``), so a client with N reports in flight and no
  round under way would be acknowledged N per 0.5 s; these rows measure what the SN can seal instead.
  Baseline: the in-process seal rate above.
- **SN start**: ``swarm sn --sentinel --data-dir`` on the 100,000-transaction chain (opened, every block
  hash, link, tx root and sealer signature verified, state replayed), from process start to its log line
  ``Starting SWARM-API-SERVER on port``; median of ``STARTS``. Baseline: the same on a genesis-only chain.
- **open in process**: ``Ledger.open`` of that chain (verify + replay), the ledger's share of the start.

    .venv/bin/python bench/ledger.py [n_tx]
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import ROOT, bench_parser, machine, positive_int, print_table
from bench.ledger_core import seal_and_reopen
from certs import Signer, Verifier, init_swarm
from contracts.ledger import Ledger
from contracts.machine import DEFAULT_CONTRACT
from daemons.broker import free_port
from wire import SignerLike

N_TX = 100_000
BATCH = 200
N_SL = 8
BUS_RUNS = ((4, 16, 2_000), (1, 64, 6_000))  # (client processes, in flight each, tx each)
STARTS = 3
START_TIMEOUT = 60.0
READY = "Starting SWARM-API-SERVER on port"
TARGET_TX_S = 1_000
TARGET_START_S = 5.0


# ------------------------------------------------------------------------------ identities
def identity_args(pki: Path, uid: str) -> list[str]:
    """``--cert/--key/--capath`` of ``uid`` in a folder made by ``certs.init_swarm``."""
    return [
        "--cert", str(pki / f"{uid}-cert.pem"), "--key", str(pki / f"{uid}-key.pem"),
        "--capath", str(pki / "ca" / "capath"),
    ]  # fmt: skip


def signer(pki: Path, uid: str) -> Signer:
    return Signer.from_files(pki / f"{uid}-cert.pem", pki / f"{uid}-key.pem")


# ----------------------------------------------------------------------- (a) seal in process
def build_chain(pki: Path, path: Path, n_tx: int) -> dict[str, Any]:
    """Seal ``n_tx`` signed transactions into a chain at ``path`` (sn-1 seals); returns the timings."""
    sls: list[SignerLike] = [signer(pki, f"sl-{i}") for i in range(1, N_SL + 1)]
    verifier = Verifier.from_ca(pki / "ca" / "capath")
    t = seal_and_reopen(path, signer(pki, "sn-1"), sls, verifier, n_tx, BATCH)
    return {
        "n_tx": t.n_tx,
        "blocks": t.blocks,
        "seal_tx_s": t.n_tx / t.seal_s,
        "verify_tx_s": t.n_tx / t.verify_s,
        "open_s": t.open_s,
        "mib": t.mib,
    }


# -------------------------------------------------------------------------------- (c) start
class SNProcess:
    """``swarm sn --sentinel`` on a data dir, its output in ``<data dir>/bench-sn.out``."""

    def __init__(
        self, data_dir: Path, pki: Path, port: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.log = data_dir / "bench-sn.out"
        self.ready_cpu = 0.0
        argv = [
            sys.executable, "-m", "daemons.cli", "sn", "--sentinel", "--data-dir", str(data_dir),
            "--sn-api-port", str(self.port), *identity_args(pki, "sn-1"),
        ]  # fmt: skip
        with self.log.open("wb") as out:
            self.started = time.perf_counter()
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **(env or {})}
            )

    def cpu(self) -> float:
        """CPU seconds (user + system) the SN process has used so far (a load-independent cost)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wait_ready(self) -> float:
        """Seconds from process start to the ready log line (``ready_cpu``: CPU seconds used by then)."""
        while True:
            if READY in self.log.read_text(errors="replace"):
                elapsed = time.perf_counter() - self.started
                self.ready_cpu = self.cpu()
                return elapsed
            if self.proc.poll() is not None or time.perf_counter() - self.started > START_TIMEOUT:
                self.stop()
                raise RuntimeError(f"swarm sn did not start:\n{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.005)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL (and its broker by PID) if it does not exit within 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self._kill_broker()

    def _kill_broker(self) -> None:
        text = self.log.read_text(errors="replace")
        marker = "mosquitto broker (pid "
        for chunk in text.split(marker)[1:]:
            pid = int(chunk.split(")", 1)[0])
            cmdline = Path(f"/proc/{pid}/cmdline")
            if cmdline.exists() and str(self.data_dir).encode() in cmdline.read_bytes():
                os.kill(pid, signal.SIGKILL)


def start_time(data_dir: Path, pki: Path, repeat: int = STARTS) -> tuple[float, float]:
    """Median seconds for ``swarm sn`` on ``data_dir`` to be ready, and median CPU seconds it used."""
    times, cpu = [], []
    for _ in range(repeat):
        sn = SNProcess(data_dir, pki)
        try:
            times.append(sn.wait_ready())
            cpu.append(sn.ready_cpu)
        finally:
            sn.stop()
    return statistics.median(times), statistics.median(cpu)


# ------------------------------------------------------------------------- (b) over the bus
async def _client(port: int, pki: Path, uid: str, count: int, in_flight: int) -> dict[str, Any]:
    """One client process: join the default contract, wait for ``go`` on stdin, submit ``count``."""
    from daemons.bus import Bus, BusConfig
    from daemons.bus.config import BrokerAddress
    from daemons.identity import Identity
    from daemons.ledger_client import LedgerClient, Rejected

    ident = Identity.load(pki / f"{uid}-cert.pem", pki / f"{uid}-key.pem", pki / "ca" / "capath")
    config = BusConfig(BrokerAddress("127.0.0.1", port, tls=True), uid, "sl", tls=ident.tls())
    presence = {"role": "sl", "host": "bench"}  # online, so liveness leaves the member alone
    async with Bus(config, signer=ident.signer(), verifier=ident.verifier(), presence=presence) as bus:
        ledger = LedgerClient(bus, "sn-1", timeout=120)
        await ledger.submit("node.register", {"host": "bench"})
        params = {"min_peers": 64, "quorum_wait": 0.0, "leader_timeout": 600.0}
        await ledger.submit("contract.join", {"contract": DEFAULT_CONTRACT, "params": params})
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        acked = rejected = 0

        async def worker(first: int) -> None:
            nonlocal acked, rejected
            for i in range(first, count, in_flight):
                body = {"contract": DEFAULT_CONTRACT, "epochs_done": i, "total_epochs": count, "loss": 1.0}
                try:
                    await ledger.submit("contract.progress", body)
                    acked += 1
                except Rejected:
                    rejected += 1

        start = time.time()
        async with asyncio.TaskGroup() as group:
            for k in range(in_flight):
                group.create_task(worker(k), name=f"{uid}.submit[{k}]")
        end = time.time()
    return {"uid": uid, "start": start, "end": end, "acked": acked, "rejected": rejected}


def client_main(argv: list[str]) -> None:
    """``bench/ledger.py --client PORT PKI UID COUNT IN_FLIGHT``: prints ``ready``, then one JSON line."""
    port, pki, uid, count, in_flight = int(argv[0]), Path(argv[1]), argv[2], int(argv[3]), int(argv[4])
    print(json.dumps(asyncio.run(_client(port, pki, uid, count, in_flight))), flush=True)


def over_the_bus(
    data_dir: Path, pki: Path, clients_n: int, in_flight: int, per_client: int
) -> dict[str, Any]:
    """tx/s acknowledged by a signed ``swarm sn`` to ``clients_n`` client processes."""
    data_dir.mkdir(parents=True)
    sn = SNProcess(data_dir, pki, env={"SWARM_SN_CHECKIN_HOLD": "0"})  # its capacity, not the hold
    clients: list[subprocess.Popen[str]] = []
    try:
        sn.wait_ready()
        for i in range(1, clients_n + 1):
            argv = [sys.executable, __file__, "--client", str(sn.port), str(pki), f"sl-{i}", str(per_client)]
            clients.append(
                subprocess.Popen(
                    [*argv, str(in_flight)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    cwd=ROOT,
                )
            )
        for client in clients:
            assert client.stdout is not None
            line = client.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"a bench client did not start: {line!r}")
        cpu_at_go = sn.cpu()
        for client in clients:
            assert client.stdin is not None
            client.stdin.write("go\n")
            client.stdin.flush()
        results = []
        for client in clients:
            assert client.stdout is not None
            results.append(json.loads(client.stdout.readline()))
        sn_cpu = sn.cpu() - cpu_at_go
        for client in clients:
            client.wait(60)
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
                client.wait()
        sn.stop()
    acked = sum(r["acked"] for r in results)
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    rejected = sum(r["rejected"] for r in results)
    return {"tx_s": acked / seconds, "acked": acked, "rejected": rejected, "sn_ms_tx": sn_cpu * 1000 / acked}


# ------------------------------------------------------------------------------------- rows
def run(n_tx: int = N_TX) -> list[dict[str, Any]]:
    """Every row of this benchmark."""
    with tempfile.TemporaryDirectory(prefix="bench-ledger-") as tmp:
        root = Path(tmp)
        pki = root / "pki"
        init_swarm(pki, sl=max(N_SL, *(n for n, _, _ in BUS_RUNS)))
        (root / "big").mkdir()
        (root / "empty").mkdir()
        built = build_chain(pki, root / "big" / "ledger.db", n_tx)
        verifier = Verifier.from_ca(pki / "ca" / "capath")
        Ledger.create(
            root / "empty" / "ledger.db", sealer=signer(pki, "sn-1"), sealer_uid="sn-1", verifier=verifier,
            now=time.time(),
        ).close()  # fmt: skip
        empty_start, empty_cpu = start_time(root / "empty", pki)
        big_start, big_cpu = start_time(root / "big", pki)
        buses = [(n, k, over_the_bus(root / f"bus-{n}x{k}", pki, n, k, m)) for n, k, m in BUS_RUNS]
    seal = built["seal_tx_s"]
    bus_rows = [
        {
            "benchmark": f"submit via swarm sn over mTLS ({n} client proc x {k} in flight)",
            "value": bus["tx_s"],
            "unit": "tx/s",
            "baseline": "seal in process (row 1)",
            "baseline_value": seal,
            "ratio": bus["tx_s"] / seal,
            "target": f"value >= {TARGET_TX_S}",
            "note": f"{bus['acked']:,} contract.progress acked, {bus['rejected']} rejected; "
            f"SN CPU {bus['sn_ms_tx']:.2f} ms/tx; the SN's check-in hold off (SWARM_SN_CHECKIN_HOLD=0)",
        }
        for n, k, bus in buses
    ]
    return [
        {
            "benchmark": f"seal {built['n_tx']:,} signed tx in process (blocks of {BATCH})",
            "value": seal,
            "unit": "tx/s",
            "baseline": "decode + verify the same envelopes only",
            "baseline_value": built["verify_tx_s"],
            "ratio": seal / built["verify_tx_s"],
            "target": f"value >= {TARGET_TX_S}",
            "note": f"X.509 ECDSA P-256; {built['blocks']:,} blocks, {built['mib']:.0f} MiB",
        },
        *bus_rows,
        {
            "benchmark": f"swarm sn start, {built['n_tx']:,}-tx chain",
            "value": big_start,
            "unit": "s",
            "baseline": "swarm sn start, genesis-only chain",
            "baseline_value": empty_start,
            "ratio": empty_start / big_start,
            "target": f"value < {TARGET_START_S:g}",
            "note": f"process start to the ready line, median of {STARTS}; "
            f"SN CPU {big_cpu:.2f} s (empty chain {empty_cpu:.2f} s)",
        },
        {
            "benchmark": f"Ledger.open (verify + replay) {built['n_tx']:,}-tx chain",
            "value": built["open_s"],
            "unit": "s",
            "baseline": "swarm sn start, same chain",
            "baseline_value": big_start,
            "ratio": built["open_s"] / big_start,
            "target": "",
            "note": "in process; ratio = the ledger's share of the start",
        },
    ]


def main() -> None:
    """Print the table (and the machine it ran on)."""
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2:])
        return
    parser = bench_parser(__doc__)
    parser.add_argument(
        "transactions", nargs="?", type=positive_int, default=N_TX,
        help="how many transactions to seal (default %(default)s)",
    )  # fmt: skip
    n_tx = parser.parse_args().transactions
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    rows = run(n_tx)
    columns = ["benchmark", "value", "unit", "baseline", "baseline_value", "ratio", "target", "note"]
    print_table("ledger (SN)", rows, columns)
    print("\nratio: value/baseline for tx/s; baseline/value for the SN start (1 = as fast as an empty chain)")
    print(f"machine: {json.dumps(machine())}")
    load = f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    print(f"bench took {time.perf_counter() - started:.0f} s; {load} ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()

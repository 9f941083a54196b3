"""SN durability end to end: a real ``swarm sn`` with certificates, SIGKILLed mid-stream and damaged on disk.

- Every write the SN acknowledged before a SIGKILL is in the chain it reopens, in the block its receipt
  named, and the chain verifies (hashes, links, tx roots, X.509 sealer signatures).
- A flipped byte in a stored block, or a missing block, stops ``swarm sn`` with one line naming the block
  (no traceback); a SIGTERM restart keeps everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from certs import Verifier, init_swarm
from contracts.block import decode_block
from contracts.blockstore import ChainError
from contracts.ledger import Ledger
from daemons.broker import ManagedBroker, free_port
from daemons.bus import Bus, BusConfig, BusError
from daemons.bus.config import BrokerAddress
from daemons.identity import Identity
from daemons.ledger_client import LedgerClient
from tests.conftest import RunningSN, start_sn
from wire import decode_envelope

pytestmark = pytest.mark.slow

SN_UID = "sn-1"
_BROKER_PID = re.compile(r"mosquitto broker \(pid (\d+)\) listening")


# --------------------------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A swarm CA with sn-1, swop-1, sl-1, sl-2 and swci-1 identities."""
    root = tmp_path_factory.mktemp("pki")
    init_swarm(root, sl=2)
    return root


def identity_args(pki: Path, uid: str = SN_UID) -> list[str]:
    """``--cert/--key/--capath`` of ``uid``."""
    return [
        "--cert", str(pki / f"{uid}-cert.pem"), "--key", str(pki / f"{uid}-key.pem"),
        "--capath", str(pki / "ca" / "capath"),
    ]  # fmt: skip


def verifier(pki: Path) -> Verifier:
    """The swarm CA's verifier, as the SN uses it."""
    return Verifier.from_ca(pki / "ca" / "capath")


@asynccontextmanager
async def ledger_of(sn: RunningSN, pki: Path, uid: str = "swci-1") -> AsyncIterator[LedgerClient]:
    """A LedgerClient to sn-1 over mutual TLS with ``uid``'s identity (signed envelopes)."""
    ident = Identity.load(pki / f"{uid}-cert.pem", pki / f"{uid}-key.pem", pki / "ca" / "capath")
    address = BrokerAddress("127.0.0.1", sn.port, tls=True)
    config = BusConfig(address, ident.uid, ident.role, tls=ident.tls(), connect_timeout=10)
    async with Bus(config, signer=ident.signer(), verifier=ident.verifier()) as bus:
        yield LedgerClient(bus, SN_UID, timeout=15)


async def submit_settled(ledger: LedgerClient, kind: str, body: dict[str, Any], entity: str, key: str) -> int:
    """Submit, then wait for the SN's event on ``entity``/``key``, the last thing it publishes for the block.

    Tests that stop the SN cleanly right after a write use it, so they stop an idle SN (stopping one in
    the middle of a block's events is ``test_sigterm_in_the_middle_of_a_stream_of_writes_stops_the_sn``).
    """
    async with ledger.watch(entity, key) as watch:
        receipt = await ledger.submit(kind, body)
        height = int(receipt["height"])
        while (await watch.next(timeout=10)).height < height:
            pass
    return height


def broker_pids(sn: RunningSN) -> list[int]:
    """PIDs of the mosquitto processes this SN said it started (from its log)."""
    return [int(pid) for pid in _BROKER_PID.findall(sn.log())]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def kill_brokers_left_by(sn: RunningSN) -> None:
    """SIGKILL, by PID, every mosquitto of this SN's data dir still running (a SIGKILLed SN leaves it).

    The PIDs come from the logs of every run on the data dir (``restart`` keeps them as ``sn.out.N``).
    """
    logs = sorted(sn.data_dir.glob("sn.out*"))
    for pid in {int(p) for log in logs for p in _BROKER_PID.findall(log.read_text(errors="replace"))}:
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if str(sn.data_dir).encode() in cmdline:  # the same process, not a reused PID
                os.kill(pid, signal.SIGKILL)


def restart(sn: RunningSN, pki: Path, *extra: str) -> RunningSN:
    """Start ``swarm sn`` again on ``sn``'s data dir.

    ``start_sn`` appends to ``<data dir>/sn.out`` and waits for the ready line in it, so the previous
    run's log is moved aside first, or it would return before the new SN is ready.
    """
    runs = len(list(sn.data_dir.glob("sn.out.*")))
    sn.log_path.rename(sn.data_dir / f"sn.out.{runs + 1}")
    return start_sn(sn.data_dir, extra=[*identity_args(pki), *extra])


@pytest.fixture
def sentinel(tmp_path: Path, pki: Path) -> Iterator[RunningSN]:
    """A signed sentinel SN of this test (stopped, and its broker reaped, afterwards)."""
    sn = start_sn(tmp_path / "sn", extra=identity_args(pki))
    yield sn
    sn.stop()
    kill_brokers_left_by(sn)


def names_by_height(path: Path, pki: Path) -> dict[str, int]:
    """``contract name -> height`` of every ``contract.create`` in the chain at ``path`` (verified)."""
    found: dict[str, int] = {}
    with Ledger.open(path, verifier=verifier(pki)) as ledger:
        for raw in ledger.raw_blocks(0):
            block = decode_block(raw)
            for tx in block.txs:
                env = decode_envelope(tx, verifier=verifier(pki))
                if env.kind == "tx:contract.create":
                    found[env.body["name"]] = block.height
    return found


# ---------------------------------------------------------------------------------- (a) SIGKILL
async def _stream_until_killed(
    sn: RunningSN, pki: Path, *, total: int, kill_after: int, concurrency: int
) -> tuple[dict[str, int], int]:
    """Submit ``total`` contract.create with ``concurrency`` in flight; SIGKILL the SN at ``kill_after`` acks.

    Returns the acknowledged writes (name -> receipt height) and how many were in flight at the kill.
    """
    acked: dict[str, int] = {}
    killed = asyncio.Event()
    in_flight = 0
    at_kill = 0
    gate = asyncio.Semaphore(concurrency)

    async def write(ledger: LedgerClient, name: str) -> None:
        nonlocal in_flight, at_kill
        async with gate:
            if killed.is_set():
                return
            in_flight += 1
            try:
                receipt = await ledger.submit("contract.create", {"name": name}, timeout=30)
            except BusError:
                return
            finally:
                in_flight -= 1
        acked[name] = int(receipt["height"])
        if len(acked) >= kill_after and not killed.is_set():
            os.kill(sn.process.pid, signal.SIGKILL)
            killed.set()
            at_kill = in_flight

    async with ledger_of(sn, pki) as ledger:
        tasks = [asyncio.create_task(write(ledger, f"durable-{i:04d}")) for i in range(total)]
        try:
            await asyncio.wait_for(killed.wait(), 30)
            await asyncio.sleep(1.0)  # acks already on their way through the broker still count
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return acked, at_kill


async def test_sigkill_mid_stream_loses_no_acknowledged_write(sentinel: RunningSN, pki: Path) -> None:
    acked, at_kill = await _stream_until_killed(sentinel, pki, total=1000, kill_after=200, concurrency=64)
    assert sentinel.process.wait(10) == -signal.SIGKILL
    kill_brokers_left_by(sentinel)
    assert len(acked) >= 200
    assert at_kill > 0, "the SN was not killed in the middle of the stream"
    assert len(acked) < 1000, "the stream finished before the kill"

    # The chain on disk verifies and holds every acknowledged write in the block its receipt named.
    stored = names_by_height(sentinel.data_dir / "ledger.db", pki)
    misplaced = {name: (h, stored.get(name)) for name, h in acked.items() if stored.get(name) != h}
    assert not misplaced, f"acknowledged writes missing or in another block: {misplaced}"

    again = restart(sentinel, pki)
    try:
        async with ledger_of(again, pki) as ledger:
            names = {view["name"] for view in await ledger.query("contracts")}
            status = await ledger.status()
            body = {"name": "after-the-crash"}
            height = await submit_settled(ledger, "contract.create", body, "contract", "after-the-crash")
            assert "after-the-crash" in {view["name"] for view in await ledger.query("contracts")}
    finally:
        assert again.stop() == 0
    assert not set(acked) - names, f"acknowledged but lost: {sorted(set(acked) - names)[:10]}"
    assert status["height"] >= max(acked.values())
    assert status["signed"] is True
    assert height == status["height"] + 1
    (verified,) = re.findall(r"verified: (\d+) blocks", again.log())
    assert int(verified) - 1 >= max(acked.values())


# ------------------------------------------------------------------------------ (b)/(c) damage
@pytest.fixture(scope="module")
def written_chain(tmp_path_factory: pytest.TempPathFactory, pki: Path) -> Path:
    """A signed chain of 8 blocks (genesis, the SN's registration, 6 writes), written by ``swarm sn``."""
    sn = start_sn(tmp_path_factory.mktemp("chain") / "sn", extra=identity_args(pki))
    try:

        async def write() -> None:
            async with ledger_of(sn, pki) as ledger:
                for i in range(2, 8):  # one at a time: one block each
                    await submit_settled(
                        ledger, "contract.create", {"name": f"block-{i}"}, "contract", f"block-{i}"
                    )

        asyncio.run(write())
    finally:
        assert sn.stop() == 0
        kill_brokers_left_by(sn)
    path = sn.data_dir / "ledger.db"
    with Ledger.open(path, verifier=verifier(pki)) as ledger:
        assert ledger.height == 7
    return path


def copy_chain(source: Path, data_dir: Path) -> Path:
    """A copy of the ledger (the SN was stopped cleanly, so the database is one file)."""
    data_dir.mkdir(parents=True)
    assert (
        not source.with_name("ledger.db-wal").exists()
        or source.with_name("ledger.db-wal").stat().st_size == 0
    )
    target = data_dir / "ledger.db"
    target.write_bytes(source.read_bytes())
    return target


def flip(path: Path, height: int, position: int) -> None:
    """Invert every bit of byte ``position`` of the stored bytes of block ``height``."""
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        (raw,) = conn.execute("SELECT raw FROM blocks WHERE height = ?", (height,)).fetchone()
        data = bytearray(raw)
        data[position] ^= 0xFF
        conn.execute("UPDATE blocks SET raw = ? WHERE height = ?", (bytes(data), height))


def block_size(path: Path, height: int) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        (raw,) = conn.execute("SELECT raw FROM blocks WHERE height = ?", (height,)).fetchone()
    return len(raw)


def run_sn(data_dir: Path, pki: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``swarm sn --sentinel`` on ``data_dir`` expecting it to stop by itself (a refused chain)."""
    argv = [
        sys.executable, "-m", "daemons.cli", "sn", "--sentinel", "--data-dir", str(data_dir),
        "--sn-api-port", str(free_port()), *identity_args(pki),
    ]  # fmt: skip
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"swarm sn kept running on a damaged chain:\n{exc.stderr!r}")


def assert_refused(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    """A non-zero exit, one clear line naming the block, and no traceback anywhere."""
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output, output
    assert "Starting SWARM-API-SERVER" not in output, output
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("swarm sn: ledger "), output
    for needle in needles:
        assert needle in last, (needle, last)


@pytest.mark.parametrize("where", ["header", "middle", "end"])
def test_a_flipped_byte_in_a_stored_block_stops_the_sn_naming_the_block(
    written_chain: Path, pki: Path, tmp_path: Path, where: str
) -> None:
    path = copy_chain(written_chain, tmp_path / "sn")
    size = block_size(path, 4)
    flip(path, 4, {"header": 6, "middle": size // 2, "end": size - 3}[where])
    done = run_sn(tmp_path / "sn", pki)
    assert_refused(done, "block 4 is corrupt", str(path))
    assert not list((tmp_path / "sn").glob("broker/*.conf")), "a broker was started for a refused chain"


def test_flipped_bytes_all_over_a_signed_sn_block_are_refused_by_name(
    written_chain: Path, tmp_path: Path, pki: Path
) -> None:
    """In process, every third byte (and the last two) of a block sealed by ``swarm sn`` (X.509, ECDSA)."""
    path = copy_chain(written_chain, tmp_path / "sn")
    trust = verifier(pki)
    size = block_size(path, 4)
    for position in [*range(0, size, 3), size - 2, size - 1]:
        flip(path, 4, position)
        with pytest.raises(ChainError) as caught:
            Ledger.open(path, verifier=trust).close()
        assert caught.value.height == 4, (position, str(caught.value))
        assert ": block 4 is corrupt: " in str(caught.value), (position, str(caught.value))
        flip(path, 4, position)
    with Ledger.open(path, verifier=trust) as ledger:
        assert ledger.height == 7


def test_a_truncated_chain_stops_the_sn_naming_the_missing_block(
    written_chain: Path, pki: Path, tmp_path: Path
) -> None:
    path = copy_chain(written_chain, tmp_path / "sn")
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("DELETE FROM blocks WHERE height = (SELECT MAX(height) FROM blocks)")
    assert_refused(run_sn(tmp_path / "sn", pki), "block 7 is missing", "8 blocks")


def test_a_missing_middle_block_stops_the_sn_naming_it(
    written_chain: Path, pki: Path, tmp_path: Path
) -> None:
    path = copy_chain(written_chain, tmp_path / "sn")
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("DELETE FROM blocks WHERE height = 3")
    assert_refused(run_sn(tmp_path / "sn", pki), "block 3 is missing")


# ------------------------------------------------------------------------------- (d) SIGTERM
async def _snapshot(ledger: LedgerClient) -> dict[str, Any]:
    """Every stored block and the views a user reads."""
    reply = await ledger.bus.request(SN_UID, "blocks", {"start": 0}, timeout=15)
    return {
        "blocks": reply["blocks"],
        "contracts": await ledger.query("contracts"),
        "tasks": await ledger.query("tasks"),
        "task": await ledger.query("task.body", name="durable-task"),
        "nodes": sorted(n["uid"] for n in await ledger.query("nodes")),
    }


async def test_a_clean_restart_keeps_everything_and_answers(sentinel: RunningSN, pki: Path) -> None:
    async with ledger_of(sentinel, pki, "sl-1") as sl:
        await sl.submit("node.register", {"host": "h", "address": "a"})
    async with ledger_of(sentinel, pki) as ledger:
        for i in range(5):
            await ledger.submit("contract.create", {"name": f"kept-{i}"})
        task = {"name": "durable-task", "type": "MAKE_USER_ENV", "author": "t", "prereq": "", "outcome": "x"}
        await ledger.submit("contract.reset", {"name": "kept-3"})
        await ledger.submit("task.create", task)
        line = {"name": "durable-task", "idx": 1, "line": "Python: 3"}
        await submit_settled(ledger, "task.append", line, "task", "durable-task")
        before = await _snapshot(ledger)
    brokers = broker_pids(sentinel)
    assert sentinel.stop(signal.SIGTERM) == 0
    assert not [pid for pid in brokers if alive(pid)], "SIGTERM left the SN's broker running"

    again = restart(sentinel, pki)
    try:
        async with ledger_of(again, pki) as ledger:
            height = await submit_settled(
                ledger, "contract.create", {"name": "after-restart"}, "contract", "after-restart"
            )
            after = await _snapshot(ledger)
    finally:
        assert again.stop() == 0
    kept = len(before["blocks"])
    assert after["blocks"][:kept] == before["blocks"], "the restarted SN's chain differs from the stored one"
    assert height == len(after["blocks"]) - 1 > kept  # + the SN's own registration at start
    assert [c for c in after["contracts"] if c["name"] != "after-restart"] == before["contracts"]
    for view in ("tasks", "task", "nodes"):
        assert after[view] == before[view], view


# -------------------------------------------------------------------------------- stopping
async def _stream_then_sigterm(sn: RunningSN, pki: Path, prefix: str) -> None:
    """Keep 32 writes in flight; SIGTERM the SN after 100 acknowledgements."""
    acked = 0
    stop = asyncio.Event()
    gate = asyncio.Semaphore(32)

    async def write(ledger: LedgerClient, name: str) -> None:
        nonlocal acked
        async with gate:
            if stop.is_set():
                return
            with contextlib.suppress(BusError):
                await ledger.submit("contract.create", {"name": name}, timeout=3)
                acked += 1
                if acked == 100:
                    sn.process.send_signal(signal.SIGTERM)
                    stop.set()

    async with ledger_of(sn, pki) as ledger:
        tasks = [asyncio.create_task(write(ledger, f"{prefix}-{i}")) for i in range(1000)]
        try:
            await asyncio.wait_for(stop.wait(), 30)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def test_sigterm_in_the_middle_of_a_stream_of_writes_stops_the_sn(sentinel: RunningSN, pki: Path) -> None:
    """Regression: on Python 3.11 ``asyncio.wait_for`` swallowed the cancellation of the sealer while it
    published a block's events, and the SN never exited (7 of 8 attempts on an idle machine)."""
    sn = sentinel
    for attempt in range(3):
        asyncio.run(_stream_then_sigterm(sn, pki, f"round{attempt}"))
        try:
            code = sn.process.wait(8)
        except subprocess.TimeoutExpired:
            sn.stop(signal.SIGKILL)
            pytest.fail(f"attempt {attempt}: the SN did not stop within 8 s of SIGTERM during a write stream")
        assert code == 0, sn.log()[-3000:]
        sn = restart(sn, pki)
    assert sn.stop() == 0


# --------------------------------------------------------------- the broker of a SIGKILLed SN
def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_a_sigkilled_sn_leaves_no_broker_behind(sentinel: RunningSN) -> None:
    """Regression: mosquitto (own session, no parent-death signal) outlived a SIGKILLed SN."""
    (pid,) = broker_pids(sentinel)
    sentinel.stop(signal.SIGKILL)
    assert _wait_gone(pid, 3), f"mosquitto (pid {pid}) outlived its SN"


def test_an_sn_restarted_on_its_port_after_a_sigkill_runs_its_own_broker(
    sentinel: RunningSN, pki: Path
) -> None:
    """Regression: the orphaned broker kept the port and the restarted SN served through it."""
    sentinel.stop(signal.SIGKILL)
    again = restart(sentinel, pki, "--sn-api-port", str(sentinel.port))
    try:
        time.sleep(1.5)
        log = again.log()
        assert "exited with" not in log, log[-2000:]
        (pid,) = broker_pids(again)
        assert alive(pid), f"the restarted SN's mosquitto (pid {pid}) is not running"
    finally:
        again.stop(signal.SIGKILL)  # a quick cleanup; the orphan and any new broker are reaped by PID
        kill_brokers_left_by(again)


def test_an_sn_whose_port_is_taken_refuses_to_start_clearly(
    fresh_mosquitto: ManagedBroker, tmp_path: Path
) -> None:
    argv = [
        sys.executable, "-m", "daemons.cli", "sn", "--sentinel", "--data-dir", str(tmp_path / "sn"),
        "--sn-api-port", str(fresh_mosquitto.port),
    ]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=8, check=False)
    except subprocess.TimeoutExpired as exc:
        restarts = str(exc.stderr).count("exited with")
        pytest.fail(f"swarm sn ran on a port another broker holds ({restarts} restarts of its own broker)")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output, output
    assert str(fresh_mosquitto.port) in done.stderr.strip().splitlines()[-1], output

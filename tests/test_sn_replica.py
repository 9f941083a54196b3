"""A second ``swarm sn`` (sn-2) replicating the sentinel (sn-1): catch-up, following, reads, forwarded writes.

Both are real subprocesses on the sentinel's mosquitto; the signed variant runs with mutual TLS and every
replicated block's sealer signature (and every transaction's) is verified by the replica.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from certs import Verifier, init_swarm
from contracts.ledger import Ledger
from daemons.bus import Bus, BusConfig, RemoteError, RpcError
from daemons.bus.config import BrokerAddress
from daemons.identity import Identity
from daemons.ledger_client import LedgerClient, Rejected
from daemons.sn.chain import LocalChain
from daemons.sn.replica import Replica
from tests.conftest import RunningSN, start_sn
from wire import encode_envelope, make_envelope

pytestmark = pytest.mark.slow

SENTINEL, REPLICA = "sn-1", "sn-2"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A swarm CA with sn-1, sn-2, sl-1, sl-2, swci-1 (and swop-1)."""
    root = tmp_path_factory.mktemp("pki")
    init_swarm(root, sn=2, sl=2)
    return root


@pytest.fixture(params=["unsigned", "signed"])
def signed(request: pytest.FixtureRequest) -> bool:
    """Run without certificates (the brief's plain command line) and with them (mutual TLS, signatures)."""
    return bool(request.param == "signed")


class Swarm:
    """The sentinel, the replica's command line, and clients for either."""

    def __init__(self, root: Path, pki: Path, signed: bool) -> None:
        self.root, self.pki, self.signed = root, pki, signed
        self.sentinel = start_sn(root / "sn-1", extra=self.identity(SENTINEL))
        self.replicas: list[RunningSN] = []

    def identity(self, uid: str) -> list[str]:
        if not self.signed:
            return []
        p = self.pki
        return [
            "--cert", str(p / f"{uid}-cert.pem"), "--key", str(p / f"{uid}-key.pem"),
            "--capath", str(p / "ca" / "capath"),
        ]  # fmt: skip

    def start_replica(self, timeout: float = 30) -> RunningSN:
        """``swarm sn --sentinel-ip 127.0.0.1 --sentinel-api-port <port> --uid sn-2 --data-dir <own>``."""
        data_dir = self.root / "sn-2"
        data_dir.mkdir(exist_ok=True)
        log_path = data_dir / f"sn.out.{len(self.replicas)}"
        argv = [
            sys.executable, "-m", "daemons.cli", "sn", "--sentinel-ip", "127.0.0.1",
            "--sentinel-api-port", str(self.sentinel.port), "--uid", REPLICA, "--data-dir", str(data_dir),
            *self.identity(REPLICA),
        ]  # fmt: skip
        with log_path.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        replica = RunningSN(proc, self.sentinel.port, data_dir, log_path)
        self.replicas.append(replica)
        deadline = time.monotonic() + timeout
        while "Starting SWARM-API-SERVER" not in replica.log():
            if proc.poll() is not None or time.monotonic() > deadline:
                replica.stop(signal.SIGKILL)
                pytest.fail(f"the replica did not start:\n{replica.log()[-3000:]}")
            time.sleep(0.05)
        return replica

    @asynccontextmanager
    async def bus(self, uid: str = "swci-1") -> AsyncIterator[Bus]:
        role = uid.split("-", maxsplit=1)[0]
        address = BrokerAddress("127.0.0.1", self.sentinel.port, tls=self.signed)
        if not self.signed:
            async with Bus(BusConfig(address, uid, role)) as bus:
                yield bus
            return
        p = self.pki
        ident = Identity.load(p / f"{uid}-cert.pem", p / f"{uid}-key.pem", p / "ca" / "capath")
        config = BusConfig(address, uid, role, tls=ident.tls())
        async with Bus(config, signer=ident.signer(), verifier=ident.verifier()) as bus:
            yield bus

    def verifier(self) -> Verifier | None:
        return Verifier.from_ca(self.pki / "ca" / "capath") if self.signed else None

    def stop(self) -> None:
        for node in (*self.replicas, self.sentinel):
            node.stop()


@pytest.fixture
def swarm(tmp_path: Path, pki: Path, signed: bool) -> Iterator[Swarm]:
    s = Swarm(tmp_path, pki, signed)
    yield s
    s.stop()


async def blocks_of(bus: Bus, sn: str) -> list[bytes]:
    """Every block ``sn`` serves, page by page."""
    out: list[bytes] = []
    while True:
        reply = await bus.request(sn, "blocks", {"start": len(out)}, timeout=15)
        out += reply["blocks"]
        if not reply["blocks"] or len(out) > reply["head"]:
            return out


async def caught_up(replica: LedgerClient, height: int, within: float = 20) -> dict[str, Any]:
    """The replica's status once it holds block ``height`` (a test helper that polls; the SN never does)."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        status = await replica.status()
        if status["height"] >= height:
            return status
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"the replica is at block {status['height']}, not {height}, after {within} s")
        await asyncio.sleep(0.05)


async def test_a_replica_catches_up_follows_serves_reads_and_forwards_writes(swarm: Swarm) -> None:
    # More blocks than one "blocks" reply holds (200), so catching up takes several pages.
    async with swarm.bus() as bus:
        sentinel = LedgerClient(bus, SENTINEL)
        for i in range(230):
            await sentinel.submit("contract.create", {"name": f"before-{i:03d}"})
        head = await sentinel.status()

    replica_node = swarm.start_replica()
    assert "replicating the ledger of sn-1" in replica_node.log()
    async with swarm.bus() as bus:
        sentinel, replica = LedgerClient(bus, SENTINEL), LedgerClient(bus, REPLICA)
        status = await caught_up(replica, head["height"])
        assert status["uid"] == REPLICA
        assert status["sentinel"] is False
        assert status["signed"] is swarm.signed
        sentinel_status = await sentinel.status()
        if status["height"] == sentinel_status["height"]:
            assert status["head"] == sentinel_status["head"]

        # follows new blocks
        receipt = await sentinel.submit("contract.create", {"name": "while-following"})
        await caught_up(replica, receipt["height"])
        assert await replica.query("contracts") == await sentinel.query("contracts")
        assert await replica.query("contract.info", name="while-following") == await sentinel.query(
            "contract.info", name="while-following"
        )

        # forwards writes, and reads its own write right after
        forwarded = await replica.submit("contract.create", {"name": "through-sn-2"})
        names = {view["name"] for view in await replica.query("contracts")}
        assert "through-sn-2" in names
        assert (await replica.status())["height"] >= forwarded["height"]
        info = await sentinel.query("contract.info", name="through-sn-2")
        assert info["created_by"] == "swci-1"

        # a rejection comes back through the replica with the sentinel's reason
        with pytest.raises(Rejected, match="through-sn-2"):
            await replica.submit("contract.create", {"name": "through-sn-2"})

        assert await blocks_of(bus, REPLICA) == await blocks_of(bus, SENTINEL)


async def test_a_killed_replica_resumes_from_its_own_copy(swarm: Swarm) -> None:
    async with swarm.bus() as bus:
        sentinel = LedgerClient(bus, SENTINEL)
        for i in range(20):
            await sentinel.submit("contract.create", {"name": f"first-{i}"})
    first = swarm.start_replica()
    async with swarm.bus() as bus:
        sentinel, replica = LedgerClient(bus, SENTINEL), LedgerClient(bus, REPLICA)
        await caught_up(replica, (await sentinel.status())["height"])
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
        for i in range(20):  # written while the replica is down
            await sentinel.submit("contract.create", {"name": f"while-down-{i}"})
        head = await sentinel.status()
        held = len(await blocks_of(bus, SENTINEL))

        second = swarm.start_replica()
        log = second.log()
        assert "replicating the ledger of" not in log, log
        assert "verified:" in log, log  # it opened (and verified) its own ledger.db
        await caught_up(replica, head["height"])
        forwarded = await replica.submit("contract.create", {"name": "after-resume"})
        assert forwarded["height"] > head["height"]
        assert await replica.query("contracts") == await sentinel.query("contracts")
        copy = await blocks_of(bus, REPLICA)
        assert copy == await blocks_of(bus, SENTINEL)
        assert len(copy) > held
    second.stop()
    with Ledger.open(second.data_dir / "ledger.db", verifier=swarm.verifier()) as ledger:
        assert ledger.height == len(copy) - 1


async def test_a_replica_does_not_forward_another_nodes_transaction(swarm: Swarm) -> None:
    """The sentinel trusts an SN's forwarded envelope; the replica must check the sender itself."""
    swarm.start_replica()
    async with swarm.bus("sl-1") as bus:
        replica = LedgerClient(bus, REPLICA)
        await caught_up(replica, 0)
        sl2 = None
        if swarm.signed:
            p = swarm.pki
            sl2 = Identity.load(p / "sl-2-cert.pem", p / "sl-2-key.pem", p / "ca" / "capath").signer()
        foreign = make_envelope("tx:node.register", {"host": "h"}, sender="sl-2", role="sl", signer=sl2)
        with pytest.raises(RemoteError, match="'sl-1' may not submit a transaction of 'sl-2'") as caught:
            await bus.request(REPLICA, "submit", {"tx": encode_envelope(foreign)}, timeout=15)
        assert caught.value.code == "rejected"
        assert "sl-2" not in {n["uid"] for n in await replica.query("nodes")}


async def _sentinel_restarted_while_replica_frozen(swarm: Swarm) -> tuple[RunningSN, int]:
    """Freeze the replica (SIGSTOP), restart the sentinel on its port and write, then thaw the replica.

    The replica misses the new sentinel's blocks (its own registration and one write) for sure: it is
    not connected when they are sealed. Returns the replica and the sentinel's height; the replica has
    reconnected when this returns.
    """
    replica_node = swarm.start_replica()
    async with swarm.bus() as bus:
        sentinel, replica = LedgerClient(bus, SENTINEL), LedgerClient(bus, REPLICA)
        await sentinel.submit("contract.create", {"name": "before-restart"})
        await caught_up(replica, (await sentinel.status())["height"])
    os.kill(replica_node.process.pid, signal.SIGSTOP)
    try:
        old = swarm.sentinel
        assert old.stop() == 0
        old.log_path.rename(old.data_dir / "sn.out.1")  # start_sn waits for the ready line in a fresh log
        same_port = [*swarm.identity(SENTINEL), "--sn-api-port", str(old.port)]  # the last one counts
        swarm.sentinel = start_sn(old.data_dir, extra=same_port)
        swarm.sentinel.port = old.port  # start_sn records the port it picked, not the one it was given
        async with swarm.bus() as bus:
            await LedgerClient(bus, SENTINEL).submit("contract.create", {"name": "while-frozen"})
            head = int((await LedgerClient(bus, SENTINEL).status())["height"])
    finally:
        os.kill(replica_node.process.pid, signal.SIGCONT)
    deadline = time.monotonic() + 20
    while "reconnected to" not in replica_node.log():
        assert time.monotonic() < deadline, replica_node.log()[-2000:]
        await asyncio.sleep(0.05)
    return replica_node, head


@pytest.mark.parametrize("signed", ["unsigned"], indirect=True)  # the same with certificates
async def test_a_replica_catches_up_after_a_sentinel_restart_without_new_writes(swarm: Swarm) -> None:
    _, head = await _sentinel_restarted_while_replica_frozen(swarm)
    async with swarm.bus() as bus:
        await caught_up(LedgerClient(bus, REPLICA), head, within=5)


@pytest.mark.parametrize("signed", ["signed"], indirect=True)
async def test_a_write_through_the_replica_after_a_sentinel_restart_brings_it_back_in_step(
    swarm: Swarm,
) -> None:
    _, head = await _sentinel_restarted_while_replica_frozen(swarm)
    async with swarm.bus() as bus:
        sentinel, replica = LedgerClient(bus, SENTINEL), LedgerClient(bus, REPLICA)
        forwarded = await replica.submit("contract.create", {"name": "forwarded-after-restart"})
        assert forwarded["height"] > head
        status = await caught_up(replica, forwarded["height"])
        assert status["head"] == (await sentinel.status())["head"]
        assert await replica.query("contracts") == await sentinel.query("contracts")
        assert await blocks_of(bus, REPLICA) == await blocks_of(bus, SENTINEL)


async def test_a_replica_refuses_a_resent_write_only_once_its_copy_holds_the_block(
    swarm: Swarm, tmp_path: Path
) -> None:
    """A write resent through a replica after the sentinel sealed it (its first answer lost) is refused as
    a duplicate; the writer reads what it wrote next, from the same SN: the refusal waits for the block."""
    async with swarm.bus() as client, swarm.bus(REPLICA) as bus:
        env = make_envelope(
            "tx:contract.create", {"name": "resent"}, sender=client.uid, role=client.role,
            signer=client.signer, voucher=client.voucher,
        )  # fmt: skip
        raw = encode_envelope(env)
        sealed = await client.request(SENTINEL, "submit", {"tx": raw}, timeout=15)
        chain = LocalChain(tmp_path / "copy.db", swarm.verifier())
        replica = Replica(bus, chain, SENTINEL)
        chain.ledger = await replica.start(None)  # the genesis only: nothing follows the sentinel
        try:
            forwarding = asyncio.create_task(replica.forward(raw))
            await asyncio.sleep(0.5)
            assert not forwarding.done()  # waiting for the block that holds the envelope
            await replica.catch_up()
            with pytest.raises(RpcError, match=f"already transaction 0 of block {sealed['height']}"):
                await asyncio.wait_for(forwarding, 5)
            assert chain.ledger.height >= sealed["height"]
        finally:
            chain.ledger.close()


@pytest.mark.parametrize("signed", ["unsigned"], indirect=True)  # nothing here depends on signatures
async def test_a_read_naming_a_newer_block_waits_until_the_replica_holds_it(swarm: Swarm) -> None:
    """Read your events: a client names the newest block it saw (``LedgerClient.height``, from the sealer's
    events and its receipts); a replica that does not hold it yet waits for it before answering, so the
    answer is at least as new as what the client saw. Here the read names the next block before it is
    sealed, so without the wait the replica would answer at once that the contract does not exist."""
    replica_node = swarm.start_replica()
    async with swarm.bus() as bus:
        sentinel, replica = LedgerClient(bus, SENTINEL), LedgerClient(bus, REPLICA)
        head = int((await caught_up(replica, (await sentinel.status())["height"]))["height"])
        replica.saw(head + 1)
        reading = asyncio.create_task(replica.query("contract.info", name="sealed-while-read"))
        await asyncio.sleep(0.3)  # the read is at the replica, waiting (it would be answered by now)
        receipt = await sentinel.submit("contract.create", {"name": "sealed-while-read"})
        assert receipt["height"] == head + 1 and sentinel.height == head + 1  # a receipt counts as seen
        info = await asyncio.wait_for(reading, 10)
        assert info["name"] == "sealed-while-read"

        # A block a peer saw (``at_least``, for this read only) that does not come: answered from what
        # the replica holds once the wait is over.
        with pytest.raises(RemoteError, match="sealed-never") as caught:
            await replica.query("contract.info", name="sealed-never", at_least=head + 50)
        assert caught.value.code == "not-found"
        assert f"block {head + 50} has not reached this SN within" in replica_node.log()
        assert replica.height == head + 1  # a peer's block is not kept for later reads

        # The height a read names is checked like any argument.
        for bad in ("7", -1, True, 2**60):
            with pytest.raises(RemoteError, match="query's 'height' must be a block height") as caught:
                await bus.request(
                    REPLICA, "query", {"name": "contracts", "args": {}, "height": bad}, timeout=15
                )
            assert caught.value.code == "bad-request"


async def test_a_client_notes_the_heights_of_the_events_it_sees(swarm: Swarm) -> None:
    async with swarm.bus() as bus:
        writer, watcher = LedgerClient(bus, SENTINEL), LedgerClient(bus, SENTINEL)
        async with watcher.watch("contract") as watch:
            receipt = await writer.submit("contract.create", {"name": "watched"})
            while (await watch.next(timeout=10)).key != "watched":
                pass
        assert watcher.height == writer.height == receipt["height"]

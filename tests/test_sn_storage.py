"""The SN's data directory misbehaving: read-only, or a disk that fills up while it runs.

Each test mounts a small tmpfs of its own (CI runs as root; elsewhere these tests skip, saying why).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.block import make_block
from contracts.blockstore import BlockStore, StorageError
from contracts.ledger import Ledger
from daemons.bus import Bus, BusConfig, RemoteError
from daemons.ledger_client import LedgerClient
from tests.conftest import SmallDisk, start_sn
from tests.swarm_helpers import RunningSL, start_sl, wait_for


def _swarm_sn(data_dir: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "daemons.cli", "sn", "--sentinel", "--data-dir", str(data_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_the_small_disk_fills_up_whatever_space_was_taken_before(small_disk: SmallDisk) -> None:
    # what the SN wrote before varies; the fill must neither raise nor leave space, whatever is left
    taken = small_disk.path / "taken"
    for size in (0, 4096, 40960, 65536, 69632):
        taken.write_bytes(bytes(size))
        small_disk.fill()
        assert os.statvfs(small_disk.path).f_bavail == 0, size
        small_disk.empty()


def test_a_read_only_data_directory_is_one_line(small_disk: SmallDisk) -> None:
    small_disk.read_only()
    done = _swarm_sn(small_disk.path / "sn")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Read-only file system" in lines[0]


def test_a_ledger_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    data_dir = tmp_path / "sn"
    (data_dir / "ledger.db").mkdir(parents=True)  # where the file should be, a directory
    done = _swarm_sn(data_dir)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert f"swarm sn: cannot open the ledger {data_dir / 'ledger.db'}" in done.stderr


def test_a_full_disk_stores_nothing_and_the_store_carries_on_when_space_is_back(
    small_disk: SmallDisk,
) -> None:
    path = small_disk.path / "ledger.db"
    store = BlockStore.create(path)
    genesis = make_block(0, b"\0" * 32, 1.0, "sn-1", [b"genesis"], signer=None)
    store.append(genesis)
    small_disk.fill()
    block = make_block(1, genesis.hash, 2.0, "sn-1", [b"x" * 200_000], signer=None)
    with pytest.raises(StorageError, match="database or disk is full"):
        store.append(block)
    assert store.height == 0
    small_disk.empty()
    store.append(block)
    store.close()
    assert BlockStore.open(path, verifier=None).height == 1


def test_the_sn_refuses_writes_while_its_disk_is_full_and_takes_them_again_after(
    small_disk: SmallDisk,
) -> None:
    sn = start_sn(small_disk.path / "sn")
    try:

        async def scenario() -> tuple[RemoteError, dict[str, object]]:
            async with Bus(BusConfig(sn.address, "swci-1", "swci")) as bus:
                ledger = await LedgerClient.connect(bus, timeout=10)
                small_disk.fill()
                with pytest.raises(RemoteError) as refused:
                    await ledger.submit("contract.create", {"name": "while-full"}, timeout=3)
                small_disk.empty()
                receipt = await ledger.submit("contract.create", {"name": "after-full"}, timeout=20)
                return refused.value, receipt

        refused, receipt = asyncio.run(scenario())
        assert refused.code == "unavailable"
        assert "database or disk is full" in refused.message
        assert "try again later" in refused.message
        assert receipt
        assert sn.process.poll() is None, "the SN died of a full disk"
    finally:
        sn.stop()
    log = sn.log()
    assert "Traceback" not in log
    assert "blocks are stored again" in log
    ledger = Ledger.open(small_disk.path / "sn" / "ledger.db", verifier=None)
    assert "after-full" in ledger.state.contracts
    assert "while-full" not in ledger.state.contracts


def test_training_waits_through_a_full_disk_and_goes_on_when_space_is_back(
    small_disk: SmallDisk, tmp_path: Path
) -> None:
    """Check-ins and progress reports refused for a full disk are retried (nothing ends training);
    both nodes finish with one model once there is space again, and the SN never dies."""
    sn = start_sn(small_disk.path / "sn")
    sls: list[RunningSL] = []
    try:
        training = {"EPOCHS": 3, "BATCHES": 8, "SYNC_FREQ": 4, "MIN_PEERS": 2, "SLEEP_PER_BATCH": 0.2}
        linger = ["--linger", "2"]  # (after the final round; 10 s by default in these tests)
        sls = [start_sl(sn, f"sl-{i}", tmp_path, sl_args=linger, SEED=i, **training) for i in (1, 2)]
        wait_for(lambda: "checked in" in sls[0].output(), 90, "a first check-in")
        small_disk.fill()
        full = "the SN cannot store blocks now"
        wait_for(lambda: any(full in sl.output() for sl in sls), 60, "a write refused for the full disk")
        small_disk.empty()
        codes = [sl.wait(120) for sl in sls]
        assert sn.process.poll() is None, "the SN died of a full disk"
    finally:
        for sl in sls:
            sl.kill()
        sn.stop()
    assert codes == [0, 0], [sl.output()[-3000:] for sl in sls]
    digests = {sl.final_digest() for sl in sls}
    assert len(digests) == 1 and None not in digests, digests
    assert "database or disk is full" in sls[0].output() + sls[1].output()
    assert "blocks are stored again" in sn.log()
    assert "Traceback" not in sn.log()

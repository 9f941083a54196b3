"""End to end with standalone SLs (``swarm sl``): real SN, broker, SL daemons and torch programs."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from contracts.ledger import Ledger
from contracts.machine import DEFAULT_CONTRACT
from contracts.state import State
from daemons.bus import Bus, BusConfig
from daemons.ledger_client import LedgerClient
from tests.conftest import RunningSN, start_sn
from tests.swarm_helpers import RunningSL, start_sl, start_together, wait_for_line
from wire import decode_envelope, encode_envelope, make_envelope

pytestmark = pytest.mark.slow


def test_three_nodes_finish_with_the_same_model(sn: RunningSN, tmp_path: Path) -> None:
    nodes = [start_sl(sn, f"sl-{i}", tmp_path, SEED=i, MIN_PEERS=3) for i in range(1, 4)]
    codes = [node.wait() for node in nodes]
    assert codes == [0, 0, 0], [n.output()[-2000:] for n in nodes]
    digests = {node.final_digest() for node in nodes}
    assert len(digests) == 1 and None not in digests
    outputs = [node.output() for node in nodes]
    # rounds go on before the ledger's close (the predicted leader merges the pushed rows), and every
    # digest the ledger then records is the one the nodes went on with
    assert sum(out.count("before the ledger closed the round") for out in outputs) > 0, outputs[0][-3000:]
    assert not any("we went on with the merged model" in out for out in outputs)
    # SLs of one host copy the models out of each other's files, none refused (daemons/sl/peer_files.py)
    assert any("copied out of their files, not sent" in out for out in outputs), outputs[0][-3000:]
    assert not any("come through the socket" in out for out in outputs)
    for node in nodes:
        log = node.output()
        assert "Starting Swarm merging round" in log
        assert "All peers and Swarm training rounds finished. Final Swarm model was loaded." in log
        assert (tmp_path / node.uid / "tiny_train_sw.log").exists()
        assert (tmp_path / node.uid / "scratch" / "final_model.pt").exists()


def _alone_under_a_long_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, epochs: int, sync_frequency: int
) -> State:
    """One node trains to its end under an SN that holds check-ins for up to 10 minutes (within 90 s,
    or the test fails); the ledger's state after it."""
    monkeypatch.setenv("SWARM_SN_CHECKIN_HOLD", "600")
    held = start_sn(tmp_path / "sn")
    try:
        node = start_sl(
            held, "sl-1", tmp_path, MIN_PEERS=1, BATCHES=4, EPOCHS=epochs, SYNC_FREQ=sync_frequency
        )
        assert node.wait(timeout=90) == 0, node.output()[-3000:]
        assert node.final_digest() is not None
    finally:
        held.stop()
    ledger = Ledger.open(tmp_path / "sn" / "ledger.db", verifier=None)
    try:
        return ledger.state
    finally:
        ledger.close()


def test_epoch_ends_do_not_wait_for_the_ledger_to_record_their_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SN holds a progress report until a round closes: an ML program waiting at each epoch's end
    # for its report would not finish within the wait.
    state = _alone_under_a_long_hold(tmp_path, monkeypatch, epochs=3, sync_frequency=100)
    member = state.contracts[DEFAULT_CONTRACT].members["sl-1"]
    assert (member.epochs_done, member.total_epochs, member.status) == (3, 3, "finished")
    assert member.loss is not None  # the last epoch's validation loss, recorded with contract.done


def test_a_merge_the_sn_holds_for_the_next_round_does_not_keep_a_finishing_node_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SN holds the round.merged of the last round before the final one for a round's close: the
    # leader's contract.done must not wait for it (it seals it).
    state = _alone_under_a_long_hold(tmp_path, monkeypatch, epochs=2, sync_frequency=2)
    book = state.rounds[DEFAULT_CONTRACT]
    assert book.pending == () and all(r.status == "MERGED" for r in book.done), book


def test_without_the_data_plane_a_round_does_not_wait_for_a_held_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the data plane a participant pulls the merge once the ledger records it: the leader's
    # round.merged must not wait in the SN's hold (here up to 10 minutes) for a close that needs the
    # participant's next check-in.
    monkeypatch.setenv("SWARM_SN_CHECKIN_HOLD", "600")
    monkeypatch.setenv("SWARM_DATAPLANE", "off")
    held = start_sn(tmp_path / "sn")
    try:
        nodes = [
            start_sl(held, f"sl-{i}", tmp_path, SEED=i, MIN_PEERS=2, EPOCHS=2, BATCHES=4, SYNC_FREQ=2)
            for i in (1, 2)
        ]
        assert [node.wait(timeout=90) for node in nodes] == [0, 0], [n.output()[-2000:] for n in nodes]
        assert nodes[0].final_digest() == nodes[1].final_digest() is not None
    finally:
        held.stop()


def test_a_killed_node_is_skipped_and_the_rest_finish(sn: RunningSN, tmp_path: Path) -> None:
    slow = {"SLEEP_PER_BATCH": 0.15, "EPOCHS": 3, "MIN_PEERS": 2}
    nodes = [start_sl(sn, f"sl-{i}", tmp_path, SEED=i, **slow) for i in range(1, 4)]
    victim = nodes[2]
    wait_for_line(victim, "Finished Swarm merging round")
    victim.kill()
    codes = [node.wait() for node in nodes[:2]]
    assert codes == [0, 0], [n.output()[-2000:] for n in nodes[:2]]
    assert nodes[0].final_digest() == nodes[1].final_digest() is not None


async def _create_contracts(sn: RunningSN, *names: str) -> None:
    async with Bus(BusConfig(sn.address, "swci-test", "swci")) as bus:
        ledger = await LedgerClient.connect(bus, timeout=10)
        for name in names:
            await ledger.submit("contract.create", {"name": name})


def test_two_trainings_under_different_contracts_both_finish(sn: RunningSN, tmp_path: Path) -> None:
    asyncio.run(_create_contracts(sn, "alpha", "beta"))
    nodes = [
        start_sl(sn, f"{c}-{i}", tmp_path, SEED=i, CONTRACT=c, MIN_PEERS=2, HIDDEN=16 if c == "alpha" else 24)
        for c in ("alpha", "beta")
        for i in (1, 2)
    ]
    assert [n.wait() for n in nodes] == [0, 0, 0, 0], [n.output()[-1500:] for n in nodes]
    alpha, beta = {n.final_digest() for n in nodes[:2]}, {n.final_digest() for n in nodes[2:]}
    assert len(alpha) == 1 and len(beta) == 1 and alpha != beta


def test_a_node_whose_model_differs_is_refused_naming_the_tensor(sn: RunningSN, tmp_path: Path) -> None:
    good = start_sl(sn, "sl-1", tmp_path, SEED=1, MIN_PEERS=2, SLEEP_PER_BATCH=0.2)
    wait_for_line(good, "joined contract")
    odd = start_sl(sn, "sl-2", tmp_path, SEED=2, MIN_PEERS=2, HIDDEN=32)
    assert odd.wait() != 0
    assert "tensor '0.weight' is float32[32, 8], the training's is float32[16, 8]" in odd.output()
    good.kill()


async def _wait_for_closed_round(sn: RunningSN, timeout: float = 90) -> dict[str, object]:
    async with Bus(BusConfig(sn.address, "swci-watch", "swci")) as bus:
        ledger = await LedgerClient.connect(bus, timeout=10)
        async with ledger.watch("round", "defaultbb.cqdb.sml.hpe") as watch:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while True:
                view = await ledger.query("contract.rounds", name="defaultbb.cqdb.sml.hpe")
                closed = [r for r in view["closed"] if not r["init"] and len(r["participants"]) == 3]
                if closed:
                    return closed[0]
                await watch.next(timeout=max(deadline - loop.time(), 0.1))


async def _wait_merged(sn: RunningSN, number: int, timeout: float = 60) -> dict[str, object]:
    async with Bus(BusConfig(sn.address, "swci-read", "swci")) as bus:
        ledger = await LedgerClient.connect(bus, timeout=10)
        async with ledger.watch("round", "defaultbb.cqdb.sml.hpe") as watch:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while True:
                view = await ledger.query("contract.rounds", name="defaultbb.cqdb.sml.hpe")
                found = [r for r in view["finished"] if r["round"] == number]
                if found:
                    return found[0]
                await watch.next(timeout=max(deadline - loop.time(), 0.1))


def test_a_leader_killed_mid_merge_is_replaced_and_the_round_finishes(sn: RunningSN, tmp_path: Path) -> None:
    delay = {"SWARM_DEBUG_MERGE_DELAY": "3"}
    nodes = {
        f"sl-{i}": start_sl(sn, f"sl-{i}", tmp_path, sl_env=delay, SEED=i, MIN_PEERS=2, EPOCHS=1, BATCHES=12)
        for i in range(1, 4)
    }
    closed = asyncio.run(_wait_for_closed_round(sn))
    leader = str(closed["leader"])
    nodes[leader].kill()
    replaced = asyncio.run(_wait_merged(sn, int(closed["round"])))  # type: ignore[call-overload]
    assert replaced["status"] == "MERGED"
    assert leader in replaced["failed_leaders"]
    assert replaced["leader"] != leader
    survivors = [n for uid, n in nodes.items() if uid != leader]
    assert [n.wait() for n in survivors] == [0, 0], [n.output()[-2000:] for n in survivors]
    assert survivors[0].final_digest() == survivors[1].final_digest() is not None


def test_a_two_process_gloo_site_ends_with_the_swarms_model_on_every_rank(
    sn: RunningSN, tmp_path: Path
) -> None:
    cpu = {"CUDA_VISIBLE_DEVICES": ""}  # gloo on CPU even on a GPU host
    ddp = start_sl(sn, "sl-ddp", tmp_path, sl_args=["--ml-nproc", "2"], SEED=1, MIN_PEERS=3, **cpu)
    singles = [start_sl(sn, f"sl-{i}", tmp_path, SEED=i, MIN_PEERS=3) for i in (2, 3)]
    codes = [ddp.wait(), *(node.wait() for node in singles)]
    assert codes == [0, 0, 0], [n.output()[-3000:] for n in (ddp, *singles)]
    assert "torch.distributed.run --standalone --nproc-per-node=2" in ddp.output()
    ranks = ddp.final_digests()
    assert len(ranks) == 2, ddp.output()[-2000:]  # both ranks hold the final model
    assert set(ranks) == {node.final_digest() for node in singles}


async def _contract_view(sn: RunningSN, query: str) -> object:
    async with Bus(BusConfig(sn.address, "swci-status", "swci")) as bus:
        ledger = await LedgerClient.connect(bus, timeout=10)
        return await ledger.query(query, name="defaultbb.cqdb.sml.hpe")


@pytest.mark.parametrize("method", ["coordmedian", "mean"])  # the mean finds NaN in its result
def test_a_node_sending_nan_is_left_out_and_the_swarm_finishes(
    sn: RunningSN, tmp_path: Path, method: str
) -> None:
    gate = {"START_GATE": tmp_path / "go"}
    nodes = [
        start_sl(sn, f"sl-{i}", tmp_path, SEED=i, MIN_PEERS=2, EPOCHS=1, MERGE=method, **poison, **gate)
        for i, poison in ((1, {"POISON": "nan"}), (2, {}), (3, {}))
    ]
    start_together(nodes, gate["START_GATE"])
    codes = [node.wait() for node in nodes]
    assert codes == [0, 0, 0], [n.output()[-2000:] for n in nodes]
    digests = {node.final_digest() for node in nodes}
    assert len(digests) == 1 and None not in digests  # the broken site ends with the swarm's model too
    status = asyncio.run(_contract_view(sn, "contract.status"))
    assert isinstance(status, dict) and status["status"] == "COMPLETE"
    assert status["merge_method"] == method
    assert status["excluded_rows"] >= 1  # the final round's at least (it waits for every member)
    assert "sl-1: tensor '0.weight' has 128 non-finite values (NaN or inf)" in status["last_exclusion"]
    perf = asyncio.run(_contract_view(sn, "contract.perfdata"))
    excluded = {row["uid"]: row["excluded"] for row in perf}  # type: ignore[attr-defined]
    assert excluded["sl-1"] == status["excluded_rows"] and excluded["sl-2"] == 0


async def _first_merged(sn: RunningSN, timeout: float = 60, *, final: bool = False) -> dict[str, object]:
    """The first merged round that is not the initial one (``final``: the final one), as soon as the
    ledger records it."""
    async with Bus(BusConfig(sn.address, "swci-merged", "swci")) as bus:
        ledger = await LedgerClient.connect(bus, timeout=10)
        async with ledger.watch("round", "defaultbb.cqdb.sml.hpe") as watch:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while True:
                view = await ledger.query("contract.rounds", name="defaultbb.cqdb.sml.hpe")
                merged = [
                    r
                    for r in view["finished"]
                    if r["status"] == "MERGED" and not r["init"] and (r["final"] or not final)
                ]
                if merged:
                    return merged[0]
                await watch.next(timeout=max(deadline - loop.time(), 0.1))


def _big_model_sl(sn: RunningSN, i: int, tmp_path: Path) -> RunningSL:
    """SL ``sl-<i>`` with a model big enough that pulling it through the broker (its data plane off)
    takes a while, 2 peers a round, 1 epoch of 12 batches."""
    return start_sl(
        sn, f"sl-{i}", tmp_path, sl_env={"SWARM_DATAPLANE": "off"}, SEED=i, MIN_PEERS=2, EPOCHS=1,
        BATCHES=12, HIDDEN=200_000,
    )  # fmt: skip


def test_a_leader_killed_right_after_round_merged_leaves_the_others_training(
    sn: RunningSN, tmp_path: Path
) -> None:
    # A big model pulled through the broker (no early pull over the data plane) keeps the others
    # pulling when the leader dies: they go on with their own models and the next round merges.
    nodes = {f"sl-{i}": _big_model_sl(sn, i, tmp_path) for i in range(1, 4)}
    leader = str(asyncio.run(_first_merged(sn))["leader"])
    nodes[leader].kill()
    survivors = [n for uid, n in nodes.items() if uid != leader]
    assert [n.wait() for n in survivors] == [0, 0], [n.output()[-2000:] for n in survivors]
    assert survivors[0].final_digest() == survivors[1].final_digest() is not None


def test_a_node_that_starts_after_the_latest_merged_model_was_lost_joins_the_next_round(
    sn: RunningSN, tmp_path: Path
) -> None:
    # As above, with the third node started only after the leader died: the swarm's latest merged model
    # may then be held by no one, and the newcomer goes on with its own model into the next round (as
    # the participants of the lost round do) instead of retrying to load it forever.
    nodes = {f"sl-{i}": _big_model_sl(sn, i, tmp_path) for i in (2, 3)}
    leader = str(asyncio.run(_first_merged(sn))["leader"])
    nodes[leader].kill()
    late = _big_model_sl(sn, 1, tmp_path)
    survivors = [n for uid, n in nodes.items() if uid != leader] + [late]
    assert [n.wait() for n in survivors] == [0, 0], [n.output()[-2000:] for n in survivors]
    assert survivors[0].final_digest() == survivors[1].final_digest() is not None


def test_a_leader_killed_right_after_the_final_round_merged_leaves_the_model_with_a_participant(
    sn: RunningSN, tmp_path: Path
) -> None:
    # The final round's leader records round.merged only once another participant took the merged model
    # over the data plane; killed right after (it kills itself), that participant serves it (issue 11).
    die = {"SWARM_DEBUG_KILL_AFTER_MERGED": "final"}
    gate = tmp_path / "go"
    nodes = {
        f"sl-{i}": start_sl(
            sn, f"sl-{i}", tmp_path, sl_env=die, SEED=i, MIN_PEERS=2, EPOCHS=1, BATCHES=12, START_GATE=gate
        )
        for i in range(1, 4)
    }
    start_together(list(nodes.values()), gate)
    final = asyncio.run(_first_merged(sn, 90, final=True))
    leader = str(final["leader"])
    survivors = [n for uid, n in nodes.items() if uid != leader]
    try:
        assert [n.wait() for n in survivors] == [0, 0], [n.output()[-2000:] for n in survivors]
        assert survivors[0].final_digest() == survivors[1].final_digest() is not None
        assert "dying right after recording the final merge" in nodes[leader].output()
    finally:
        nodes[leader].kill()


def test_a_leader_dying_after_handing_over_its_early_merge_is_replaced_by_a_node_that_went_on(
    sn: RunningSN, tmp_path: Path
) -> None:
    # The first node to lead a round of 3 from round 3 on dies right after another participant took the
    # merge it made before the ledger's close (it kills itself once the ledger holds its check-in): the
    # others went on with that merge, so one of them must merge the round the ledger hands it, from the
    # rows pulled again. (Rounds of 2 after that death do not trigger it again.)
    die = {"SWARM_DEBUG_KILL_AFTER_MERGED": "early"}
    gate = tmp_path / "go"
    nodes = [
        start_sl(
            sn, f"sl-{i}", tmp_path, sl_env=die, SEED=i, MIN_PEERS=2, EPOCHS=2, BATCHES=24, SYNC_FREQ=2,
            START_GATE=gate,
        )
        for i in range(1, 4)
    ]  # fmt: skip
    start_together(nodes, gate)
    try:
        codes = [n.wait() for n in nodes]
        dead = [n for n in nodes if "dying right after handing over the early merge" in n.output()]
        assert len(dead) == 1 and codes.count(0) == 2, [n.output()[-2000:] for n in nodes]
    finally:
        for node in nodes:
            node.kill()
    survivors = [n for n in nodes if n is not dead[0]]
    assert survivors[0].final_digest() == survivors[1].final_digest() is not None
    died = re.search(r"handing over the early merge of round (\d+)", dead[0].output())
    assert died is not None
    # a survivor merged and recorded that round (the ledger keeps only the last rounds: read the logs)
    recorded = re.compile(rf"round {died.group(1)} merged from 2 models")
    assert any(recorded.search(n.output()) for n in survivors), [n.output()[-3000:] for n in survivors]


async def _forge_offline_presence_when_waiting(sn: RunningSN, uid: str, timeout: float = 90) -> int:
    """Once ``uid`` alone checked in to an open round, publish its presence as ``offline`` and, once the SN
    marked it offline (dropping that check-in), ``online`` again: what its broker's will and its reconnect
    say when its broker drops it. Returns the round."""
    async with Bus(BusConfig(sn.address, "swci-forger", "swci")) as bus:
        ledger = await LedgerClient.connect(bus, timeout=10)
        async with bus.subscribe(bus.topics.presence(uid)) as presence:
            online = await asyncio.wait_for(presence.get(), 10)  # the retained one: topic and session
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            view = await ledger.query("contract.rounds", name=DEFAULT_CONTRACT)
            rnd = view.get("open") or {}
            checkins = rnd.get("checkins") or []
            # an open round's own "init" is set only when it closes: its check-ins say whether it is one
            if [c["uid"] for c in checkins] == [uid] and not any(c.get("init") for c in checkins):
                break
            assert loop.time() < deadline, f"{uid} never waited alone in a round: {view}"
            await asyncio.sleep(0.05)
        said = decode_envelope(online.payload, what="presence")
        offline = make_envelope("presence", {**said.body, "state": "offline"}, sender=uid, role=said.role)
        async with ledger.watch("node", uid) as node:
            await bus.publish(online.topic, encode_envelope(offline))
            while (await node.next(timeout=30)).view.get("online"):
                pass  # until the SN marked it offline (it registers again at once)
        again = make_envelope("presence", said.body, sender=uid, role=said.role)
        await bus.publish(online.topic, encode_envelope(again), retain=True)
        return int(rnd["round"])


def test_a_node_whose_check_in_the_ledger_dropped_while_it_was_offline_checks_in_again(
    sn: RunningSN, tmp_path: Path
) -> None:
    """The SN marks a node offline (its will) while its check-in waits in an open round, which drops the
    check-in; the node registers and joins again and checks in again, so the round closes with it."""
    fast = start_sl(sn, "sl-1", tmp_path, SEED=1, MIN_PEERS=2, EPOCHS=1, BATCHES=12)
    slow = start_sl(sn, "sl-2", tmp_path, SEED=2, MIN_PEERS=2, EPOCHS=1, BATCHES=12, SLEEP_PER_BATCH=1)
    number = asyncio.run(_forge_offline_presence_when_waiting(sn, "sl-1"))
    assert [fast.wait(180), slow.wait(180)] == [0, 0], [n.output()[-3000:] for n in (fast, slow)]
    assert fast.final_digest() == slow.final_digest() is not None
    log = fast.output()
    assert "registering it again" in log
    assert f"round {number}: the ledger dropped our check-in while it had this node offline" in log

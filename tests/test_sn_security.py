"""The SN with certificates: mutual TLS on its broker, signed transactions, roles, and hostile input.

A real ``swarm sn`` with sn-1's identity (its mosquitto then requires client certificates and enforces the
per-uid ACL); clients are real ``Bus`` sessions with the identities ``certs.init_swarm`` issued.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest

from certs import client_context, init_swarm
from contracts.machine import DEFAULT_CONTRACT
from contracts.views import find_round
from daemons.bus import Bus, BusConfig, BusConnectError, RemoteError
from daemons.bus.config import BrokerAddress
from daemons.identity import Identity
from daemons.ledger_client import LedgerClient, Rejected
from tests.conftest import RunningSN, start_sn
from wire import encode_envelope, make_envelope
from wire.envelope import Envelope

pytestmark = pytest.mark.slow

SN = "sn-1"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    init_swarm(root, sl=2)
    return root


@pytest.fixture(scope="module")
def secure_sn(tmp_path_factory: pytest.TempPathFactory, pki: Path) -> Iterator[RunningSN]:
    """One signed SN for the module (every test works on its own names)."""
    ids = ["--cert", str(pki / "sn-1-cert.pem"), "--key", str(pki / "sn-1-key.pem")]
    node = start_sn(
        tmp_path_factory.mktemp("sn") / "sn", extra=[*ids, "--capath", str(pki / "ca" / "capath")]
    )
    yield node
    node.stop()


def identity(pki: Path, uid: str) -> Identity:
    return Identity.load(pki / f"{uid}-cert.pem", pki / f"{uid}-key.pem", pki / "ca" / "capath")


@asynccontextmanager
async def session(sn: RunningSN, pki: Path, uid: str) -> AsyncIterator[Bus]:
    """A bus session with ``uid``'s identity: mutual TLS, signed and verified envelopes."""
    ident = identity(pki, uid)
    address = BrokerAddress("127.0.0.1", sn.port, tls=True)
    config = BusConfig(address, ident.uid, ident.role, tls=ident.tls(), connect_timeout=10)
    async with Bus(config, signer=ident.signer(), verifier=ident.verifier()) as bus:
        yield bus


def tx(ident: Identity, kind: str, body: dict[str, Any]) -> Envelope:
    """A transaction envelope signed by ``ident``."""
    return make_envelope(f"tx:{kind}", body, sender=ident.uid, role=ident.role, signer=ident.signer())


async def submit_raw(bus: Bus, raw: bytes) -> dict[str, Any]:
    """Send envelope bytes to the SN's ``submit`` as they are (the client library would sign them right)."""
    return dict(await bus.request(SN, "submit", {"tx": raw}, timeout=15))


async def rejected(bus: Bus, raw: bytes) -> str:
    """The SN's reason for refusing ``raw``."""
    with pytest.raises(RemoteError) as caught:
        await submit_raw(bus, raw)
    assert caught.value.code == "rejected", caught.value
    return caught.value.message


# -------------------------------------------------------------------------------- accepted
async def test_an_sl_identity_submits_signed_transactions_that_are_accepted(
    secure_sn: RunningSN, pki: Path
) -> None:
    async with session(secure_sn, pki, "sl-1") as bus:
        ledger = LedgerClient(bus, SN)
        registered = await ledger.submit("node.register", {"host": "h1", "address": "a1"})
        params = {"min_peers": 1, "total_epochs": 1}
        joined = await ledger.submit("contract.join", {"contract": DEFAULT_CONTRACT, "params": params})
        assert joined["height"] > registered["height"] > 0
        node = await ledger.query("node", uid="sl-1")
        assert node["type"] == "SL"  # the role is the certificate's OU
        with pytest.raises(Rejected, match="body role 'sn' does not match the sender's role 'sl'"):
            await ledger.submit("node.register", {"host": "h1", "role": "sn"})
        status = await ledger.status()
        assert status["signed"] is True


async def test_a_replayed_transaction_is_rejected_as_a_duplicate(secure_sn: RunningSN, pki: Path) -> None:
    async with session(secure_sn, pki, "swci-1") as bus:
        raw = encode_envelope(tx(identity(pki, "swci-1"), "contract.create", {"name": "replayed"}))
        first = await submit_raw(bus, raw)
        reason = await rejected(bus, raw)
        assert "duplicate transaction" in reason
        assert f"of block {first['height']}" in reason


# -------------------------------------------------------------------------- forged envelopes
async def test_a_body_changed_after_signing_is_rejected(secure_sn: RunningSN, pki: Path) -> None:
    async with session(secure_sn, pki, "swci-1") as bus:
        signed = encode_envelope(tx(identity(pki, "swci-1"), "contract.create", {"name": "honest"}))
        fields = msgpack.unpackb(signed)
        fields["b"] = msgpack.packb({"name": "forged"})
        reason = await rejected(bus, msgpack.packb(fields))
        assert "signature by 'swci-1' does not verify" in reason, reason
        names = {c["name"] for c in await LedgerClient(bus, SN).query("contracts")}
        assert not {"honest", "forged"} & names


@pytest.mark.parametrize(
    ("forge", "reason"),
    [
        ("unsigned", "is not signed"),
        ("no-certificate", "is not signed"),
        ("other-certificate", "certificate CN is 'sl-2' but the message claims 'sl-1'"),
        ("claimed-role", "'sl-1' claims role 'swci' but its certificate says 'sl'"),
        ("changed-kind", "signature by 'sl-1' does not verify"),
        ("changed-time", "signature by 'sl-1' does not verify"),
    ],
)
async def test_forged_transaction_envelopes_are_rejected_with_the_reason(
    secure_sn: RunningSN, pki: Path, forge: str, reason: str
) -> None:
    sl1, sl2 = identity(pki, "sl-1"), identity(pki, "sl-2")
    fields = msgpack.unpackb(encode_envelope(tx(sl1, "node.register", {"host": forge})))
    if forge == "unsigned":
        fields["sig"] = None
    elif forge == "no-certificate":
        fields["crt"] = None
    elif forge == "other-certificate":
        fields["crt"] = sl2.signer().cert_der
    elif forge == "claimed-role":  # sl-1's own key over an envelope that claims role swci
        env = make_envelope("tx:contract.create", {"name": "escalated"}, sender="sl-1", role="swci")
        fields = msgpack.unpackb(encode_envelope(env))
        fields["sig"] = sl1.signer().sign(env.signed_bytes())
        fields["crt"] = sl1.signer().cert_der
    elif forge == "changed-kind":
        fields["k"] = "tx:node.offline"
    elif forge == "changed-time":
        fields["t"] = fields["t"] + 3600.0
    async with session(secure_sn, pki, "sl-1") as bus:
        got = await rejected(bus, msgpack.packb(fields))
        assert reason in got, got
        assert "sl-1" in got, got
        assert "escalated" not in {c["name"] for c in await LedgerClient(bus, SN).query("contracts")}


async def test_a_client_cannot_submit_another_uids_transaction(secure_sn: RunningSN, pki: Path) -> None:
    """sl-1 relays a transaction that sl-2 really signed: valid signature, wrong submitter."""
    foreign = encode_envelope(tx(identity(pki, "sl-2"), "node.register", {"host": "relayed"}))
    async with session(secure_sn, pki, "sl-1") as bus:
        reason = await rejected(bus, foreign)
        assert reason == "'sl-1' may not submit a transaction of 'sl-2'"
        nodes = {n["uid"] for n in await LedgerClient(bus, SN).query("nodes")}
        assert "sl-2" not in nodes


# ------------------------------------------------------------------------ relayed check-ins
def checkin(contract: str, digest: str) -> dict[str, Any]:
    return {"contract": contract, "digest": digest, "samples": 10, "weight": 1.0, "init": False}


async def two_members(sn: RunningSN, pki: Path, contract: str) -> None:
    """``contract`` with sl-1 and sl-2 as members (a round of both)."""
    async with session(sn, pki, "swci-1") as bus:
        await LedgerClient(bus, SN).submit("contract.create", {"name": contract})
    for uid in ("sl-1", "sl-2"):
        async with session(sn, pki, uid) as bus:
            ledger = LedgerClient(bus, SN)
            await ledger.submit("node.register", {"host": "h", "address": "a"})
            params = {"min_peers": 2, "total_epochs": 1}
            await ledger.submit("contract.join", {"contract": contract, "params": params})


async def test_an_sl_relays_a_peers_signed_check_in_which_the_ledger_takes_as_the_peers(
    secure_sn: RunningSN, pki: Path
) -> None:
    # the predicted leader submits the check-in its participant pushed with its row, with its own
    await two_members(secure_sn, pki, "relayed")
    peers = encode_envelope(tx(identity(pki, "sl-2"), "round.checkin", checkin("relayed", "22" * 32)))
    async with session(secure_sn, pki, "sl-1") as bus:
        ledger = LedgerClient(bus, SN)
        receipt = await ledger.submit("round.checkin", checkin("relayed", "11" * 32), relayed=[peers])
        rounds = await ledger.query("contract.rounds", name="relayed")
    taken = find_round(rounds, receipt["round"])
    assert taken is not None
    assert {c["uid"]: c["digest"] for c in taken["checkins"]} == {"sl-1": "11" * 32, "sl-2": "22" * 32}
    assert taken["status"] == "CLOSED"  # both in one block: the round closed in it
    async with session(secure_sn, pki, "sl-2") as bus:  # the peer submits it itself too: already held
        body = checkin("relayed", "22" * 32)
        again = await LedgerClient(bus, SN).submit("round.checkin", body, signed=peers)
    assert again["duplicate"] is True and again["round"] == receipt["round"]


async def test_only_signed_check_ins_are_relayed_and_only_by_an_sl(secure_sn: RunningSN, pki: Path) -> None:
    await two_members(secure_sn, pki, "relay-hostile")
    sl2 = identity(pki, "sl-2")
    forged = msgpack.unpackb(encode_envelope(tx(sl2, "round.checkin", checkin("relay-hostile", "22" * 32))))
    forged["b"] = msgpack.packb(checkin("relay-hostile", "33" * 32))  # changed after sl-2 signed it
    register = tx(sl2, "node.register", {"host": "relayed"})  # not a check-in
    relayed = [msgpack.packb(forged), encode_envelope(register), b"\x92not an envelope"]
    async with session(secure_sn, pki, "sl-1") as bus:
        ledger = LedgerClient(bus, SN)
        body = checkin("relay-hostile", "11" * 32)
        receipt = await ledger.submit("round.checkin", body, relayed=relayed)  # its own is taken
        rounds = await ledger.query("contract.rounds", name="relay-hostile")
        host = (await ledger.query("node", uid="sl-2"))["host"]
    taken = find_round(rounds, receipt["round"])
    assert taken is not None
    assert [c["uid"] for c in taken["checkins"]] == ["sl-1"]
    assert host == "h"  # the relayed node.register was left out
    async with session(secure_sn, pki, "swci-1") as bus:
        peers = encode_envelope(tx(sl2, "round.checkin", checkin("relay-hostile", "22" * 32)))
        own = encode_envelope(tx(identity(pki, "swci-1"), "contract.create", {"name": "relay-by-swci"}))
        with pytest.raises(RemoteError, match="may not relay check-ins: only an SL does"):
            await bus.request(SN, "submit", {"tx": own, "relayed": [peers]}, timeout=15)
        with pytest.raises(RemoteError, match="'relayed' must be a list of at most 64 envelopes"):
            await bus.request(SN, "submit", {"tx": own, "relayed": "not a list"}, timeout=15)


# ------------------------------------------------------------------------------------ roles
@pytest.mark.parametrize(
    ("uid", "kind", "body", "needs"),
    [
        ("swci-1", "round.checkin", {"contract": DEFAULT_CONTRACT, "digest": "00" * 32}, "sl"),
        ("swci-1", "contract.join", {"contract": DEFAULT_CONTRACT, "params": {}}, "sl"),
        ("sl-1", "contract.create", {"name": "by-an-sl"}, "sn or swci"),
        ("sl-1", "round.close", {"contract": DEFAULT_CONTRACT, "round": 1}, "sn"),
        (
            "swop-1",
            "task.create",
            {"name": "t", "type": "RUN_SWARM", "author": "a", "prereq": "", "outcome": ""},
            "sn or swci",
        ),
    ],
)
async def test_a_transaction_of_another_role_is_rejected_naming_the_role(
    secure_sn: RunningSN, pki: Path, uid: str, kind: str, body: dict[str, Any], needs: str
) -> None:
    role = uid.split("-", maxsplit=1)[0]
    async with session(secure_sn, pki, uid) as bus:
        with pytest.raises(Rejected) as caught:
            await LedgerClient(bus, SN).submit(kind, body)
    assert caught.value.reason == f"tx:{kind} must come from a node of role {needs}, not {role} {uid!r}"


# ----------------------------------------------------------------------------- the broker
async def test_the_sns_broker_refuses_clients_without_a_swarm_certificate(
    secure_sn: RunningSN, pki: Path, tmp_path: Path
) -> None:
    plain = BusConfig(BrokerAddress("127.0.0.1", secure_sn.port), "sl-1", "sl", connect_timeout=2)
    with pytest.raises(BusConnectError):
        async with Bus(plain):
            pass
    no_cert = client_context(None, None, pki / "ca" / "capath")
    address = BrokerAddress("127.0.0.1", secure_sn.port, tls=True)
    with pytest.raises(BusConnectError, match="requires a TLS client certificate"):
        async with Bus(BusConfig(address, "sl-1", "sl", tls=no_cert, connect_timeout=5)):
            pass
    init_swarm(tmp_path, sl=1)  # another swarm's CA
    stranger = client_context(tmp_path / "sl-1-cert.pem", tmp_path / "sl-1-key.pem", pki / "ca" / "capath")
    with pytest.raises(BusConnectError, match="certificate"):
        async with Bus(BusConfig(address, "sl-1", "sl", tls=stranger, connect_timeout=5)):
            pass


# ------------------------------------------------------------------------------ hostile input
def _deep(levels: int) -> bytes:
    return b"\x91" * levels + b"\xc0"  # [[[...[nil]...]]]


async def test_malformed_requests_do_not_hurt_the_sn(secure_sn: RunningSN, pki: Path) -> None:
    async with session(secure_sn, pki, "sl-1") as bus:
        topic = bus.topics.request("sl-1", SN)
        valid = msgpack.unpackb(bus.encode("req:status", {}, reply_to="sl-1", corr="c0"))
        garbage = [
            b"",
            b"\xc1",  # never valid msgpack
            os.urandom(4096),
            msgpack.packb([1, 2, 3]),
            msgpack.packb({"v": 1}),
            msgpack.packb({**valid, "b": b"\xc1"}),
            msgpack.packb({**valid, "b": _deep(5000)}),
            msgpack.packb({**valid, "s": "sl-1/../sn-1"}),
            msgpack.packb({**valid, "sig": b"x" * 70}),
            msgpack.packb({**valid, "crt": os.urandom(600)}),
            msgpack.packb({**valid, "ext": 1}),
            b"\xdf\xff\xff\xff\xff",  # a map claiming 4 billion entries
            _deep(100_000),
        ]
        for payload in garbage:
            await bus.publish(topic, payload)
        # Signed requests with bodies the SN must refuse politely.
        bad_calls: list[tuple[str, dict[str, Any], str]] = [
            ("submit", {}, "bad-request"),
            ("submit", {"tx": "not bytes"}, "bad-request"),
            ("submit", {"tx": b"\xc1garbage"}, "rejected"),
            ("submit", {"tx": msgpack.packb({"v": 1, "k": 5})}, "rejected"),
            ("submit", {"tx": _deep(5000)}, "rejected"),
            ("query", {"name": 5}, "bad-request"),
            ("query", {"name": "contracts", "args": [1]}, "bad-request"),
            ("query", {"name": "no.such.query", "args": {}}, "not-found"),
            ("query", {"name": "node", "args": {}}, "bad-request"),  # a missing argument
            ("blocks", {"start": -1}, "bad-request"),
            ("blocks", {"start": "0"}, "bad-request"),
            ("shutdown", {}, "unknown-method"),
        ]
        for method, body, code in bad_calls:
            with pytest.raises(RemoteError) as caught:
                await bus.request(SN, method, body, timeout=10)
            assert caught.value.code == code, (method, body, caught.value.code, caught.value.message)
        # Still alive, still answering, still accepting.
        ledger = LedgerClient(bus, SN)
        assert (await ledger.status())["uid"] == SN
        await ledger.submit("node.register", {"host": "after-the-garbage"})
    assert secure_sn.process.poll() is None
    assert "Traceback" not in secure_sn.log()


async def test_many_hostile_requests_at_once_leave_the_sn_answering(secure_sn: RunningSN, pki: Path) -> None:
    async with session(secure_sn, pki, "sl-2") as bus:
        topic = bus.topics.request("sl-2", SN)
        await asyncio.gather(*(bus.publish(topic, os.urandom(n % 2000)) for n in range(500)))
        forged = encode_envelope(tx(identity(pki, "sl-1"), "node.register", {"host": "x"}))
        calls = [bus.request(SN, "submit", {"tx": forged}, timeout=20) for _ in range(50)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, RemoteError) and r.code == "rejected" for r in results), results
        assert (await LedgerClient(bus, SN).status())["uid"] == SN
    assert secure_sn.process.poll() is None


async def test_malformed_read_arguments_are_bad_requests(sn: RunningSN) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("blocks", {"start": 2**63}),
        ("query", {"name": "nodes", "args": {"role": 5}}),
        ("query", {"name": "nodes", "args": {"role": ["sl"]}}),
        (
            "query",
            {"name": "taskrunner.peer_status", "args": {"name": "defaulttaskbb.taskdb.sml.hpe", "swop": {}}},
        ),
    ]
    codes = []
    async with Bus(BusConfig(sn.address, "swci-1", "swci")) as bus:
        for method, body in calls:
            with pytest.raises(RemoteError) as caught:
                await bus.request(SN, method, body, timeout=10)
            codes.append(caught.value.code)
        assert (await LedgerClient(bus, SN).status())["uid"] == SN
    assert "Traceback" not in sn.log(), sn.log()[-3000:]
    assert codes == ["bad-request"] * len(calls), codes


def test_a_resend_counts_as_accepted_whichever_duplicate_answer_the_ledger_gives() -> None:
    from contracts.tx import is_duplicate  # what LedgerClient.submit counts as accepted when resent

    sealed_before = "duplicate transaction: this exact envelope is already transaction 0 of block 7"
    same_block = "duplicate transaction: this exact envelope was sent twice in one batch"
    assert is_duplicate(sealed_before) and is_duplicate(same_block)
    assert not is_duplicate("contract 'x' exists already")

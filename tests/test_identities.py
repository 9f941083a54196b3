"""Identities against a real SN and mosquitto with mutual TLS: nodes sharing an SL certificate stay
inside that identity's namespace, one live session per node, revocation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from certs import init_swarm
from daemons.bus import Bus, RemoteError, RequestTimeout
from daemons.bus.config import BrokerAddress
from daemons.bus.endpoint import Message, Subscription
from daemons.identity import Identity, IdentityError, node_uid, open_bus
from daemons.ledger_client import LedgerClient, Rejected
from tests.conftest import RunningSN, start_sn
from wire import CodecError, SignatureError, decode_envelope, encode_envelope, make_envelope

SN = "sn-1"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    init_swarm(root, sl=3)
    return root


@pytest.fixture(scope="module")
def secure_sn(tmp_path_factory: pytest.TempPathFactory, pki: Path) -> Iterator[RunningSN]:
    ids = ["--cert", str(pki / "sn-1-cert.pem"), "--key", str(pki / "sn-1-key.pem")]
    node = start_sn(
        tmp_path_factory.mktemp("sn") / "sn", extra=[*ids, "--capath", str(pki / "ca" / "capath")]
    )
    yield node
    node.stop()


def identity(pki: Path, cn: str) -> Identity:
    return Identity.load(pki / f"{cn}-cert.pem", pki / f"{cn}-key.pem", pki / "ca" / "capath")


@asynccontextmanager
async def node(sn: RunningSN, pki: Path, cn: str, uid: str | None = None) -> AsyncIterator[Bus]:
    """A node ``uid`` (default: the CN) under certificate ``cn``, with presence, as an SL runs."""
    ident = identity(pki, cn)
    address = BrokerAddress("127.0.0.1", sn.port, tls=True)
    presence = {"role": ident.role, "host": "test"}
    async with open_bus(
        ident, address, uid or ident.uid, ident.role, network="swarm", presence=presence
    ) as bus:
        yield bus


def test_only_an_sl_certificate_may_be_shared_by_named_nodes(pki: Path) -> None:
    assert node_uid(identity(pki, "sl-1"), "sl1") == "sl1"
    with pytest.raises(IdentityError, match="only an SL certificate may be shared"):
        node_uid(identity(pki, "swop-1"), "swop-a")


async def test_nodes_sharing_a_certificate_register_under_it_and_stay_in_its_namespace(
    secure_sn: RunningSN, pki: Path
) -> None:
    async with node(secure_sn, pki, "sl-1", "sl1") as sl1, node(secure_sn, pki, "sl-2") as sl2:
        ledger = LedgerClient(sl1, SN)
        await ledger.submit("node.register", {"host": "h", "session": sl1.session})
        view = await ledger.query("node", uid="sl1")
        assert (view["uid"], view["identity"]) == ("sl1", "sl-1")
        # sl1 writes only under nodes/sl-1/: the broker drops what it publishes into sl-2's part
        victim = sl2.topics.own("sl-2", "sl-2") + "/status"
        own = sl1.topics.presence("sl1")
        spoof = sl2.topics.own("sl-2", "sl1") + "/status"
        async with (
            sl2.subscribe(victim) as theirs,
            sl2.subscribe(spoof) as spoofed,
            sl2.subscribe(own) as mine,
        ):
            fake = sl1.encode("presence", {"state": "online", "note": "fake"})
            await sl1.publish(spoof, fake)  # sl1 pretending to live under sl-2: the broker drops it
            await sl1.publish(victim, fake)  # sl-2's own namespace: dropped
            await sl1.publish(own, fake)  # its own: delivered
            got = sl2.open(await asyncio.wait_for(_next_new(mine), 5))
            assert (got.sender, got.identity, got.body.get("note")) == ("sl1", "sl-1", "fake")
            for refused in (theirs, spoofed):
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(_next_new(refused), 1)
        # the SN refuses a transaction of sl1 signed by another identity
        foreign = make_envelope(
            "tx:node.register", {"host": "x"}, sender="sl1", role="sl", signer=identity(pki, "sl-2").signer(),
            voucher="sl-2",
        )  # fmt: skip
        async with node(secure_sn, pki, "sl-2", "sl1") as impostor:
            with pytest.raises(
                RemoteError, match="node 'sl1' belongs to identity 'sl-1'; 'sl-2' may not act"
            ):
                await impostor.request(SN, "submit", {"tx": encode_envelope(foreign)}, timeout=15)


async def _next_new(sub: Subscription) -> Message:
    """The next message that is not an old retained one."""
    while True:
        message = await sub.get()
        if not message.retain or b"fake" in message.payload:
            return message


def test_an_envelope_cannot_claim_a_voucher_it_is_not_signed_by(pki: Path) -> None:
    env = make_envelope(
        "k", {}, sender="sl1", role="sl", signer=identity(pki, "sl-1").signer(), voucher="sl-1"
    )
    raw = bytearray(encode_envelope(env))
    tampered = bytes(raw).replace(b"sl-1", b"sl-2", 1)
    with pytest.raises((SignatureError, CodecError)):
        decode_envelope(tampered, verifier=identity(pki, "sl-1").verifier())
    swop = identity(pki, "swop-1")
    vouched = make_envelope("k", {}, sender="swop-x", role="swop", signer=swop.signer(), voucher="swop-1")
    with pytest.raises(SignatureError, match="only sl identities vouch"):
        decode_envelope(encode_envelope(vouched), verifier=swop.verifier())


async def test_a_second_session_of_a_node_is_refused_and_its_end_leaves_the_first_online(
    secure_sn: RunningSN, pki: Path
) -> None:
    async with node(secure_sn, pki, "sl-1", "sl-twin") as first:
        ledger = LedgerClient(first, SN)
        await ledger.submit("node.register", {"host": "first", "session": first.session})
        async with node(secure_sn, pki, "sl-1", "sl-twin") as second:
            with pytest.raises(Rejected, match=r"already online .* a second session of one node is refused"):
                await LedgerClient(second, SN).submit(
                    "node.register", {"host": "second", "session": second.session}
                )
        # the second session ended (its presence said offline); the first is still online and accepted
        await asyncio.sleep(2)
        assert (await ledger.query("node", uid="sl-twin"))["online"] is True
        await ledger.submit("node.register", {"host": "first", "session": first.session})
    async with node(secure_sn, pki, "swop-1") as watcher:
        ledger_after = LedgerClient(watcher, SN)
        deadline = asyncio.get_running_loop().time() + 20
        while (await ledger_after.query("node", uid="sl-twin"))["online"]:
            assert asyncio.get_running_loop().time() < deadline, "the node did not go offline when it ended"
            await asyncio.sleep(0.2)


async def test_a_revoked_identity_is_refused_by_the_ledger_and_its_nodes_go_offline(
    secure_sn: RunningSN, pki: Path
) -> None:
    address = BrokerAddress("127.0.0.1", secure_sn.port, tls=True)
    async with (
        node(secure_sn, pki, "sl-3", "sl-revoked") as victim,
        node(secure_sn, pki, "swop-1", "swop-1") as not_admin,
        open_bus(identity(pki, "swci-1"), address, "swci-1", "swci", network="swarm") as swci,
    ):
        await LedgerClient(victim, SN).submit("node.register", {"host": "h", "session": victim.session})
        with pytest.raises(Rejected, match=r"must come from a node of role sn or swci"):
            await LedgerClient(not_admin, SN).submit("identity.revoke", {"identity": "sl-3"})
        ledger = LedgerClient(swci, SN)
        await ledger.submit("identity.revoke", {"identity": "sl-3", "reason": "lost laptop"})
        revoked = await ledger.query("identities.revoked")
        assert [(r["identity"], r["by"], r["reason"]) for r in revoked] == [("sl-3", "swci-1", "lost laptop")]
        view = await ledger.query("node", uid="sl-revoked")
        assert view["online"] is False
        assert view["offline_reason"] == "identity sl-3 revoked by swci-1: lost laptop"
        # from then on the broker and the SN refuse it (tests/test_revocation.py): its requests go unanswered
        with pytest.raises(RequestTimeout):
            await LedgerClient(victim, SN, timeout=2).submit(
                "node.register", {"host": "h", "session": victim.session}
            )

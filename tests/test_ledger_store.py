"""The block store and the ledger: durability, chain verification, duplicates, signatures, replication."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from contracts.blockstore import ChainError
from contracts.devkeys import DevAuthority, DevSigner
from contracts.ledger import Accepted, Ledger
from contracts.machine import DEFAULT_CONTRACT
from contracts.state import state_hash
from contracts.tx import Rejection, duplicate_block
from wire.envelope import Envelope, decode_envelope, encode_envelope, make_envelope

C = DEFAULT_CONTRACT
CA = DevAuthority("test-ledger-store")
SN = CA.issue("sn1", "sn")


def _env(
    signer: DevSigner | None, kind: str, body: dict[str, Any], *, uid: str = "", role: str = ""
) -> bytes:
    sender = signer.uid if signer is not None else uid
    claimed = signer.role if signer is not None else role
    return encode_envelope(make_envelope("tx:" + kind, body, sender=sender, role=claimed, signer=signer))


def _register(signer: DevSigner) -> bytes:
    return _env(signer, "node.register", {"host": "h"})


def _join(signer: DevSigner) -> bytes:
    return _env(signer, "contract.join", {"contract": C, "params": {"min_peers": 2}})


@pytest.fixture
def signed(tmp_path: Path) -> Ledger:
    return Ledger.create(
        tmp_path / "ledger.db", sealer=SN, sealer_uid="sn1", verifier=CA.verifier(), now=100.0
    )


def _seal(ledger: Ledger, envelopes: list[bytes], now: float = 200.0) -> list[Accepted | Rejection]:
    signer = SN if ledger.signed else None
    return list(ledger.seal(envelopes, sealer=signer, sealer_uid="sn1", now=now).results)


def _grow(ledger: Ledger, blocks: int = 3) -> None:
    for i in range(blocks):
        sl = CA.issue(f"sl{i}", "sl")
        results = _seal(ledger, [_register(sl), _join(sl)], now=200.0 + i)
        assert all(isinstance(r, Accepted) for r in results), results


def _rewrite(path: Path, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(sql, args)
    conn.close()


def test_genesis_and_reopen_give_the_same_state(signed: Ledger) -> None:
    assert signed.height == 0
    _grow(signed)
    digest, head, height, path = state_hash(signed.state), signed.head_hash, signed.height, signed.path
    signed.close()
    with Ledger.open(path, verifier=CA.verifier()) as again:
        assert (state_hash(again.state), again.head_hash, again.height) == (digest, head, height)
        assert again.state.contracts[C].status == "ACTIVE"


def test_unsigned_ledger(tmp_path: Path) -> None:
    ledger = Ledger.create(tmp_path / "l.db", sealer=None, sealer_uid="sn1", verifier=None, now=1.0)
    result = ledger.seal(
        [_env(None, "node.register", {}, uid="sl1", role="sl")], sealer=None, sealer_uid="sn1", now=2.0
    )
    assert result.height == 1
    digest = state_hash(ledger.state)
    ledger.close()
    with Ledger.open(tmp_path / "l.db", verifier=None) as again:
        assert state_hash(again.state) == digest
    with pytest.raises(ChainError, match="not signed, but a verifier was given"):
        Ledger.open(tmp_path / "l.db", verifier=CA.verifier())


def test_signed_chain_needs_a_verifier(signed: Ledger) -> None:
    signed.close()
    with pytest.raises(ChainError, match="the chain is signed; open it with the swarm's certificates"):
        Ledger.open(signed.path, verifier=None)


def test_create_refuses_an_existing_ledger_and_open_a_missing_one(signed: Ledger, tmp_path: Path) -> None:
    with pytest.raises(FileExistsError):
        Ledger.create(signed.path, sealer=SN, sealer_uid="sn1", verifier=CA.verifier(), now=1.0)
    with pytest.raises(FileNotFoundError):
        Ledger.open(tmp_path / "nope.db", verifier=None)


def test_garbage_file_is_a_chain_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ChainError, match="not a readable ledger database"):
        Ledger.open(path, verifier=None)


def test_seal_results_receipts_and_changes(signed: Ledger) -> None:
    sl1, sl2 = CA.issue("sl1", "sl"), CA.issue("sl2", "sl")
    _seal(signed, [_register(sl1), _register(sl2), _join(sl1), _join(sl2)])
    checkin = _env(sl1, "round.checkin", {"contract": C, "digest": "abcd"})
    bad = _env(sl1, "contract.join", {"contract": "nope"})
    result = signed.seal([bad, checkin], sealer=SN, sealer_uid="sn1", now=300.0)
    assert result.height == 2
    assert isinstance(result.results[0], Rejection)
    assert "CREATE CONTRACT nope first" in result.results[0].reason
    accepted = result.results[1]
    assert isinstance(accepted, Accepted)
    assert (accepted.height, accepted.index, dict(accepted.receipt)) == (2, 0, {"contract": C, "round": 1})
    assert result.changes == (("round", C),)
    assert result.accepted == 1


def test_nothing_accepted_writes_no_block(signed: Ledger) -> None:
    result = signed.seal([b"\x00garbage"], sealer=SN, sealer_uid="sn1", now=300.0)
    assert result.height is None
    assert signed.height == 0
    assert isinstance(result.results[0], Rejection)


def test_block_time_never_goes_back(signed: Ledger) -> None:
    _seal(signed, [_register(CA.issue("sl1", "sl"))], now=500.0)
    result = signed.seal([_register(CA.issue("sl2", "sl"))], sealer=SN, sealer_uid="sn1", now=400.0)
    assert result.time == 500.0
    assert signed.state.nodes["sl2"].last_seen == 500.0


def test_duplicate_envelope_is_rejected(signed: Ledger) -> None:
    env = _register(CA.issue("sl1", "sl"))
    first, again = _seal(signed, [env, env])
    assert isinstance(first, Accepted)
    assert isinstance(again, Rejection)
    assert "sent twice in one batch" in again.reason
    (later,) = _seal(signed, [env])
    assert isinstance(later, Rejection)
    assert later.reason == "duplicate transaction: this exact envelope is already transaction 0 of block 1"
    assert duplicate_block(later.reason) == 1  # what an SN that forwarded it waits for
    assert duplicate_block(again.reason) is None


def _with(env: bytes, **changes: Any) -> bytes:
    old = decode_envelope(env)
    fields = {f: getattr(old, f) for f in Envelope.__slots__ if not f.startswith("__")}
    fields.update(changes)
    return encode_envelope(Envelope(**fields))


def test_a_bad_signature_rejects_only_that_transaction(signed: Ledger) -> None:
    sl1, sl2 = CA.issue("sl1", "sl"), CA.issue("sl2", "sl")
    good = _register(sl1)
    forged = _with(_register(sl2), signature=b"\x01" * 64)
    unsigned = _env(None, "node.register", {}, uid="sl3", role="sl")
    stolen = _with(_register(sl2), sender="sl4")  # sl2's certificate claimed by sl4
    liar = DevSigner("sl2", "swci", sl2._key, sl2.cert_der)  # signs well, claims a role its cert lacks
    wrong_role = _register(liar)
    not_tx = _env(sl2, "hello", {}).replace(b"tx:hello", b"xx:hello")
    results = _seal(signed, [forged, good, unsigned, stolen, wrong_role, not_tx])
    assert [type(r).__name__ for r in results] == ["Rejection", "Accepted", *["Rejection"] * 4]
    reasons = [r.reason for r in results if isinstance(r, Rejection)]
    assert "does not verify" in reasons[0]
    assert "is not signed" in reasons[1]
    assert "not 'sl4'" in reasons[2]
    assert "claims role 'swci'" in reasons[3]
    assert "sl1" in signed.state.nodes
    assert set(signed.state.nodes) == {"sl1"}


def test_sealer_must_fit_the_chain(signed: Ledger) -> None:
    with pytest.raises(ValueError, match="seal with a signer"):
        signed.seal([], sealer=None, sealer_uid="sn1", now=1.0)
    with pytest.raises(ValueError, match="not sn 'sn2'"):
        signed.seal([], sealer=SN, sealer_uid="sn2", now=1.0)


def _flip(path: Path, height: int, position: int) -> None:
    conn = sqlite3.connect(path)
    (raw,) = conn.execute("SELECT raw FROM blocks WHERE height = ?", (height,)).fetchone()
    data = bytearray(raw)
    data[position] ^= 0x01
    with conn:
        conn.execute("UPDATE blocks SET raw = ? WHERE height = ?", (bytes(data), height))
    conn.close()


def _block_len(path: Path, height: int) -> int:
    conn = sqlite3.connect(path)
    (raw,) = conn.execute("SELECT raw FROM blocks WHERE height = ?", (height,)).fetchone()
    conn.close()
    return len(raw)


def test_every_flipped_byte_of_a_block_names_that_block(tmp_path: Path) -> None:
    path = tmp_path / "flip.db"
    ledger = Ledger.create(path, sealer=None, sealer_uid="sn1", verifier=None, now=1.0)
    for i in range(3):
        ledger.seal(
            [_env(None, "node.register", {}, uid=f"sl{i}", role="sl")], sealer=None, sealer_uid="sn1", now=2.0
        )
    ledger.close()
    with Ledger.open(path, verifier=None) as before:
        digest = state_hash(before.state)
    for position in range(_block_len(path, 2)):
        _flip(path, 2, position)
        with pytest.raises(ChainError) as caught:
            Ledger.open(path, verifier=None)
        assert caught.value.height == 2, (position, str(caught.value))
        assert str(caught.value).startswith(f"ledger {path}: block 2 is corrupt: ")
        _flip(path, 2, position)
    with Ledger.open(path, verifier=None) as again:
        assert state_hash(again.state) == digest


def test_flipped_bytes_of_a_signed_block(signed: Ledger) -> None:
    _grow(signed, 3)
    path = signed.path
    signed.close()
    size = _block_len(path, 2)
    for position in [*range(0, size, max(1, size // 40)), size - 1, size - 30, size - 200]:
        _flip(path, 2, position)
        with pytest.raises(ChainError, match=f"ledger {path}: block 2 is corrupt: ") as caught:
            Ledger.open(path, verifier=CA.verifier())
        assert caught.value.height == 2
        _flip(path, 2, position)
    with Ledger.open(path, verifier=CA.verifier()) as again:
        assert again.height == 3


def test_hash_does_not_match_contents(signed: Ledger) -> None:
    _grow(signed, 2)
    signed.close()
    _rewrite(signed.path, "UPDATE blocks SET hash = ? WHERE height = 1", b"\x00" * 32)
    with pytest.raises(ChainError, match="block 1 is corrupt: its hash does not match its contents"):
        Ledger.open(signed.path, verifier=CA.verifier())


def test_a_block_sealed_by_a_stranger_is_rejected(signed: Ledger) -> None:
    _grow(signed, 2)
    signed.close()
    other = DevAuthority("another swarm")
    with pytest.raises(ChainError, match="block 0 is corrupt: its sealer signature does not verify"):
        Ledger.open(signed.path, verifier=other.verifier())


def test_truncated_chain(signed: Ledger) -> None:
    _grow(signed, 4)
    signed.close()
    _rewrite(signed.path, "DELETE FROM blocks WHERE height = 4")
    with pytest.raises(ChainError, match="head record says 5 blocks but block 4 is missing") as caught:
        Ledger.open(signed.path, verifier=CA.verifier())
    assert caught.value.height == 4


def test_missing_middle_block(signed: Ledger) -> None:
    _grow(signed, 4)
    signed.close()
    _rewrite(signed.path, "DELETE FROM blocks WHERE height = 2")
    with pytest.raises(ChainError, match="head record says 5 blocks but block 2 is missing"):
        Ledger.open(signed.path, verifier=CA.verifier())


def test_lost_tx_index_is_detected(signed: Ledger) -> None:
    _grow(signed, 2)
    signed.close()
    _rewrite(signed.path, "DELETE FROM txs WHERE height = 1")
    with pytest.raises(ChainError, match="index of"):
        Ledger.open(signed.path, verifier=CA.verifier())


def test_replica_follows_the_sentinel(signed: Ledger, tmp_path: Path) -> None:
    _grow(signed, 3)
    raws = signed.raw_blocks(0)
    assert len(raws) == 4
    assert signed.raw_blocks(1, 3) == raws[1:3]
    replica = Ledger.from_genesis(tmp_path / "replica.db", raws[0], verifier=CA.verifier())
    changes = [replica.append_block(raw) for raw in raws[1:]]
    assert ("node", "sl0") in changes[0]
    assert state_hash(replica.state) == state_hash(signed.state)
    assert replica.head_hash == signed.head_hash
    with pytest.raises(ChainError, match="block 3 is rejected: it does not follow the head"):
        replica.append_block(raws[3])


def test_replica_refuses_a_tampered_block(signed: Ledger, tmp_path: Path) -> None:
    _grow(signed, 1)
    raws = signed.raw_blocks(0)
    replica = Ledger.from_genesis(tmp_path / "replica.db", raws[0], verifier=CA.verifier())
    before = state_hash(replica.state)
    tampered = bytearray(raws[1])
    tampered[-5] ^= 0xFF  # inside the sealer's certificate
    with pytest.raises(ChainError, match="block 1"):
        replica.append_block(bytes(tampered))
    assert state_hash(replica.state) == before
    assert replica.height == 0
    replica.append_block(raws[1])
    assert replica.height == 1


def test_a_lost_head_record_is_detected(signed: Ledger) -> None:
    _grow(signed, 1)
    signed.close()
    _rewrite(signed.path, "DELETE FROM meta WHERE key = 'head'")
    with pytest.raises(ChainError, match="its head record is missing"):
        Ledger.open(signed.path, verifier=CA.verifier())


def test_a_crash_before_genesis_leaves_a_ledger_that_can_be_created(tmp_path: Path) -> None:
    from contracts.blockstore import BlockStore

    path = tmp_path / "sub" / "ledger.db"
    BlockStore.create(path).close()  # schema written, genesis never appended
    with pytest.raises(ChainError, match="holds no genesis block"):
        Ledger.open(path, verifier=None)
    with Ledger.create(path, sealer=None, sealer_uid="sn1", verifier=None, now=1.0) as ledger:
        assert ledger.height == 0

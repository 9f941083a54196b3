"""The ledger: a verified block store plus the state that replaying it gives.

The SN seals batches of transaction envelopes into blocks (``seal``); a replicating SN appends the
sentinel's blocks (``append_block``). Either way a block is on disk before anything about it is returned.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from contracts.block import (
    GENESIS_PREV,
    Block,
    BlockError,
    decode_block,
    make_block,
    tx_hash,
    verify_signature,
)
from contracts.blockstore import BlockStore, ChainError
from contracts.machine import apply, changed_entities, genesis_transactions, receipt
from contracts.state import EMPTY_STATE, State
from contracts.tasks import BodyValidator, taskdefs_validator
from contracts.tx import (
    SENT_TWICE,
    TX_PREFIX,
    Rejection,
    Tx,
    duplicate_rejection,
    tx_from_envelope,
    tx_from_wire,
)
from wire.envelope import SignerLike, VerifierLike, decode_envelope, encode_envelope, make_envelope
from wire.errors import CodecError

__all__ = ["Accepted", "Ledger", "SealResult"]

log = logging.getLogger(__name__)

Change = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Accepted:
    """An envelope that is now transaction ``index`` of block ``height``."""

    height: int
    index: int
    tx_hash: bytes
    receipt: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class SealResult:
    """The outcome of ``seal``: one result per envelope, in order, and what changed.

    ``height``, ``block_hash`` and ``raw`` (the stored block) are None when no envelope was accepted (no
    block was written).
    """

    height: int | None
    block_hash: bytes | None
    time: float
    results: tuple[Accepted | Rejection, ...]
    changes: tuple[Change, ...]
    raw: bytes | None = None

    @property
    def accepted(self) -> int:
        """How many envelopes went into the block."""
        return sum(isinstance(r, Accepted) for r in self.results)


class _Replay:
    """Applies verified blocks to a state while the store is opened."""

    def __init__(self) -> None:
        self.state = EMPTY_STATE

    def __call__(self, block: Block) -> None:
        state = self.state
        for i, raw in enumerate(block.txs):
            try:
                tx = tx_from_wire(raw, block.time)
            except ValueError as exc:
                raise ChainError(
                    block.height, f"block {block.height} is corrupt: transaction {i} is {exc}"
                ) from None
            result = apply(state, tx, validate_body=None)
            if isinstance(result, Rejection):
                raise ChainError(
                    block.height,
                    f"block {block.height} transaction {i} ({tx.kind} from {tx.sender!r}) was accepted "
                    f"when sealed but is rejected on replay: {result.reason} (was the ledger written by "
                    "an incompatible version?)",
                )
            state = result
        self.state = state


class Ledger:
    """The chain and its state. Not thread-safe: one caller at a time."""

    def __init__(
        self,
        store: BlockStore,
        state: State,
        verifier: VerifierLike | None,
        validate_body: BodyValidator | None = taskdefs_validator,
    ) -> None:
        self._store = store
        self._state = state
        self._verifier = verifier
        self._validate_body = validate_body

    # --- opening ---------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        *,
        sealer: SignerLike | None,
        sealer_uid: str,
        verifier: VerifierLike | None,
        now: float,
        validate_body: BodyValidator | None = taskdefs_validator,
    ) -> Ledger:
        """Create a ledger at ``path`` and seal its genesis block.

        The chain is signed when ``sealer`` is given; then ``verifier`` must be given too.
        ``validate_body`` checks task bodies at FINALIZE when sealing (``taskdefs`` by default).

        Raises:
            FileExistsError: when ``path`` already holds a chain.
            ValueError: when the sealer and verifier do not go together.
        """
        if (sealer is None) != (verifier is None):
            msg = "a signed ledger needs both a sealer and a verifier; an unsigned one neither"
            raise ValueError(msg)
        _check_sealer(sealer, sealer_uid)
        envelopes = [
            encode_envelope(
                make_envelope(TX_PREFIX + kind, body, sender=sealer_uid, role="sn", signer=sealer, when=now)
            )
            for kind, body in genesis_transactions(sealer_uid)
        ]
        store = BlockStore.create(path)
        try:
            replay = _Replay()
            block = make_block(0, GENESIS_PREV, now, sealer_uid, envelopes, sealer)
            replay(block)
            store.append(block)
        except BaseException:
            store.close()
            raise
        return cls(store, replay.state, verifier, validate_body)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        verifier: VerifierLike | None,
        validate_body: BodyValidator | None = taskdefs_validator,
    ) -> Ledger:
        """Open ``path``: verify the whole chain and replay it into the state.

        Raises:
            FileNotFoundError: when there is no ledger at ``path``.
            ChainError: naming the first bad or missing block.
        """
        replay = _Replay()
        store = BlockStore.open(path, verifier=verifier, visit=replay)
        return cls(store, replay.state, verifier, validate_body)

    @classmethod
    def from_genesis(
        cls, path: str | os.PathLike[str], raw: bytes, *, verifier: VerifierLike | None
    ) -> Ledger:
        """Start a replica at ``path`` from the sentinel's genesis block ``raw`` (fully verified)."""
        store = BlockStore.create(path)
        ledger = cls(store, EMPTY_STATE, verifier)
        try:
            ledger.append_block(raw)
        except BaseException:
            store.close()
            raise
        return ledger

    # --- reading ---------------------------------------------------------------------------

    @property
    def state(self) -> State:
        """The state after the last block."""
        return self._state

    @property
    def height(self) -> int:
        """Height of the last block."""
        return self._store.height

    @property
    def head_hash(self) -> bytes:
        """Hash of the last block."""
        return self._store.head_hash

    @property
    def head_time(self) -> float:
        """Time of the last block: later blocks never have an earlier time."""
        return self._store.head_time

    @property
    def path(self) -> Path:
        """Where the ledger is stored."""
        return self._store.path

    @property
    def signed(self) -> bool:
        """Whether blocks are signed by their sealer."""
        return bool(self._store.signed)

    def raw_blocks(self, start: int, end: int | None = None) -> list[bytes]:
        """The stored bytes of blocks ``start`` .. ``end - 1`` (to the head when ``end`` is None)."""
        stop = self.height + 1 if end is None else min(end, self.height + 1)
        return self._store.raw_range(max(0, start), stop)

    # --- sealing ---------------------------------------------------------------------------

    def seal(
        self,
        envelopes: Sequence[bytes],
        *,
        sealer: SignerLike | None,
        sealer_uid: str,
        now: float,
        replicate: Callable[[int, bytes], None] | None = None,
        follow_up: Callable[[State, float], Sequence[bytes]] | None = None,
    ) -> SealResult:
        """Apply ``envelopes`` in order and commit the accepted ones as ONE new block.

        ``replicate(height, raw)``, when given, must put the new block in a replicated log before it is
        stored here; if it raises, nothing is stored (and the exception propagates).
        ``follow_up(state, time)``, when given, names more envelopes (the sealer's own, due in the state
        the batch gave) to apply after them into the same block; their results are not returned.

        Each envelope is decoded (its signature verified when the ledger has a verifier), checked for
        an exact duplicate, and applied; any problem rejects that envelope only. The block time is
        ``now``, or the previous block's time if the clock went back.

        Raises:
            ValueError: when the sealer does not fit the chain (signed or not).
            sqlite3.Error: when the block cannot be stored; then nothing was accepted.
        """
        if self.signed != (sealer is not None):
            msg = "this ledger is signed; seal with a signer" if self.signed else "this ledger is unsigned"
            msg += "" if self.signed else "; seal without a signer"
            raise ValueError(msg)
        _check_sealer(sealer, sealer_uid)
        time = max(float(now), self.head_time)
        height = self.height + 1
        old = self._state
        state, accepted, results = self._evaluate(envelopes, height, time)
        if follow_up is not None and accepted:
            extra = follow_up(state, time)
            if extra:
                state, more, _ = self._evaluate(extra, height, time, state=state, index=len(accepted))
                accepted += more
        if not accepted:
            return SealResult(None, None, time, results, ())
        block = make_block(height, self.head_hash, time, sealer_uid, accepted, sealer)
        if replicate is not None:
            replicate(height, block.raw)
        self._store.append(block)
        self._state = state
        return SealResult(height, block.hash, time, results, tuple(changed_entities(old, state)), block.raw)

    def _evaluate(
        self,
        envelopes: Sequence[bytes],
        height: int,
        time: float,
        *,
        state: State | None = None,
        index: int = 0,
    ) -> tuple[State, list[bytes], tuple[Accepted | Rejection, ...]]:
        """Apply ``envelopes`` to ``state`` (default: the head's) as transactions ``index``.. of block
        ``height``."""
        hashes = [tx_hash(bytes(raw)) for raw in envelopes]
        stored = self._store.tx_locations(hashes)
        seen: set[bytes] = set()
        state = self._state if state is None else state
        accepted: list[bytes] = []
        results: list[Accepted | Rejection] = []
        for raw, digest in zip(envelopes, hashes, strict=True):
            outcome: Accepted | Rejection | None = self._dedup(digest, stored, seen)
            if outcome is None:
                tried = self._try(state, bytes(raw), time)
                if isinstance(tried, Rejection):
                    outcome = tried
                else:
                    state, tx = tried
                    outcome = Accepted(height, index + len(accepted), digest, receipt(state, tx))
                    accepted.append(bytes(raw))
                    seen.add(digest)
            results.append(outcome)
        return state, accepted, tuple(results)

    @staticmethod
    def _dedup(digest: bytes, stored: Mapping[bytes, tuple[int, int]], seen: set[bytes]) -> Rejection | None:
        if digest in stored:
            height, index = stored[digest]
            return duplicate_rejection(index, height)
        if digest in seen:
            return Rejection(SENT_TWICE)
        return None

    def _try(self, state: State, raw: bytes, time: float) -> tuple[State, Tx] | Rejection:
        tx = self._decode(raw, time)
        if isinstance(tx, Rejection):
            return tx
        new = _apply_safely(state, tx, self._validate_body)
        return new if isinstance(new, Rejection) else (new, tx)

    def _decode(self, raw: bytes, time: float) -> Tx | Rejection:
        try:
            env = decode_envelope(raw, verifier=self._verifier, what="transaction")
        except CodecError as exc:
            return Rejection(str(exc))
        except Exception as exc:  # a verifier bug must reject this envelope only
            return Rejection(f"transaction could not be verified ({type(exc).__name__}: {exc})")
        return tx_from_envelope(env, time)

    # --- replication -----------------------------------------------------------------------

    def append_block(self, raw: bytes) -> list[Change]:
        """Verify the block ``raw`` (and every transaction's signature) and append it (a replica).

        Raises:
            ChainError: when the block does not verify or does not extend this chain; nothing changes.
        """
        try:
            block = decode_block(raw)
        except BlockError as exc:
            raise ChainError(self.height + 1, f"the new block is corrupt: {exc}", self.path) from None
        self._check_next(block)
        state = self._replay_verified(block)
        self._store.append(block)
        old, self._state = self._state, state
        return changed_entities(old, state)

    def _check_next(self, block: Block) -> None:
        h = block.height
        try:
            if h != self.height + 1:
                raise BlockError(f"it does not follow the head (block {self.height})")
            if block.prev_hash != self.head_hash:
                raise BlockError(f"it does not link to block {h - 1}")
            if block.time < self.head_time:
                raise BlockError(f"its time is earlier than block {h - 1}'s")
            if self._verifier is not None:
                verify_signature(block, self._verifier)
            elif block.sig is not None:
                raise BlockError("it is signed, but this ledger has no verifier")
        except BlockError as exc:
            raise ChainError(h, f"block {h} is rejected: {exc}", self.path) from None

    def _replay_verified(self, block: Block) -> State:
        h = block.height
        hashes = [tx_hash(raw) for raw in block.txs]
        if len(set(hashes)) != len(hashes) or self._store.tx_locations(hashes):
            raise ChainError(h, f"block {h} is rejected: it repeats a transaction", self.path)
        state = self._state
        for i, raw in enumerate(block.txs):
            tx = self._decode(raw, block.time)
            result = tx if isinstance(tx, Rejection) else apply(state, tx, validate_body=None)
            if isinstance(result, Rejection):
                msg = f"block {h} is rejected: its transaction {i} is not valid here: {result.reason}"
                raise ChainError(h, msg, self.path)
            state = result
        return state

    # --- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the store."""
        self._store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _check_sealer(sealer: SignerLike | None, sealer_uid: str) -> None:
    if sealer is not None and (sealer.uid != sealer_uid or sealer.role != "sn"):
        msg = f"the sealer's key is {sealer.role} {sealer.uid!r}, not sn {sealer_uid!r}"
        raise ValueError(msg)


def _apply_safely(state: State, tx: Tx, validate_body: BodyValidator | None) -> State | Rejection:
    try:
        return apply(state, tx, validate_body=validate_body)
    except Exception as exc:  # a bug in one rule must not take the SN down; the tx is not stored
        log.exception("ledger: applying %s from %s failed", tx.kind, tx.sender)
        return Rejection(f"internal ledger error while applying {tx.kind} ({type(exc).__name__}: {exc})")

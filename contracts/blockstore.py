"""The append-only block store in SQLite (WAL, ``synchronous=FULL``), verified when opened.

Tables: ``blocks(height, hash, raw)``, ``txs(hash, height, idx)`` (the sha256 of every stored envelope,
so an exact replay of a transaction is found), ``meta`` (``signed``, recorded with genesis, and the head
record ``[height, hash, time]``). A block, its tx hashes and the new head record are committed in one
transaction, so after ``append`` returns the block is on disk.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import msgpack

from contracts.block import GENESIS_PREV, Block, BlockError, decode_block, tx_hash, verify_signature
from wire.envelope import VerifierLike
from wire.limits import packb

__all__ = ["BlockStore", "ChainError", "LedgerError", "StorageError"]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS blocks (height INTEGER PRIMARY KEY, hash BLOB NOT NULL, raw BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS txs (hash BLOB PRIMARY KEY, height INTEGER NOT NULL, idx INTEGER NOT NULL)"
    " WITHOUT ROWID",
)


class LedgerError(Exception):
    """Base of the ledger's errors."""


class StorageError(LedgerError):
    """A block could not be written (e.g. the disk is full); the store and the chain are unchanged."""


class ChainError(LedgerError):
    """The stored chain is not valid; ``height`` is the first bad or missing block (None: no block)."""

    def __init__(self, height: int | None, reason: str, path: str | os.PathLike[str] | None = None) -> None:
        self.height = height
        self.reason = reason
        self.path = None if path is None else str(path)
        super().__init__(reason if path is None else f"ledger {path}: {reason}")


def _corrupt(height: int, why: str) -> ChainError:
    return ChainError(height, f"block {height} is corrupt: {why}")


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


class BlockStore:
    """Blocks on disk. Not thread-safe: one caller at a time (the SN's sealing task)."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path
        self._signed: bool | None = None
        self._head: tuple[int, bytes, float] = (-1, GENESIS_PREV, float("-inf"))
        self._tx_count = 0

    # --- opening ---------------------------------------------------------------------------

    @classmethod
    def create(cls, path: str | os.PathLike[str]) -> BlockStore:
        """Create an empty store at ``path`` (its genesis block is the first ``append``).

        Raises:
            FileExistsError: when ``path`` already holds blocks.
        """
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        store = cls(_connect(target), target)
        try:
            for statement in _SCHEMA:
                store._conn.execute(statement)
            if store._conn.execute("SELECT 1 FROM blocks LIMIT 1").fetchone() is not None:
                msg = f"ledger {target} already exists; open it instead of creating it"
                raise FileExistsError(msg)
        except BaseException:
            store.close()
            raise
        return store

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        verifier: VerifierLike | None = None,
        visit: Callable[[Block], None] | None = None,
    ) -> BlockStore:
        """Open and verify the chain at ``path``; ``visit`` is called with each verified block in order.

        Raises:
            FileNotFoundError: when there is no ledger at ``path``.
            ChainError: naming the first bad or missing block.
        """
        target = Path(path)
        if not target.is_file():
            msg = f"no ledger at {target}"
            raise FileNotFoundError(msg)
        try:
            conn = _connect(target)
        except sqlite3.DatabaseError as exc:
            raise ChainError(None, f"it is not a readable ledger database ({exc})", target) from None
        store = cls(conn, target)
        try:
            store._verify(verifier, visit)
        except ChainError as exc:
            store.close()
            raise ChainError(exc.height, exc.reason, target) from None
        except sqlite3.DatabaseError as exc:
            store.close()
            raise ChainError(None, f"it is not a readable ledger database ({exc})", target) from None
        except BaseException:
            store.close()
            raise
        return store

    def _meta(self, key: str) -> bytes | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def _read_head(self) -> tuple[bool, int, bytes]:
        signed, head = self._meta("signed"), self._meta("head")
        if signed is None or head is None:
            if self._conn.execute("SELECT 1 FROM blocks LIMIT 1").fetchone() is None:
                raise ChainError(0, "it holds no genesis block (create the ledger again)")
            raise ChainError(None, "its head record is missing")
        try:
            height, digest, _ = msgpack.unpackb(head)
        except Exception:  # a damaged head record
            raise ChainError(None, "its head record cannot be decoded") from None
        return signed == b"\x01", int(height), bytes(digest)

    def _verify(self, verifier: VerifierLike | None, visit: Callable[[Block], None] | None) -> None:
        signed, head_height, head_hash = self._read_head()
        if signed and verifier is None:
            raise ChainError(0, "the chain is signed; open it with the swarm's certificates (a verifier)")
        if not signed and verifier is not None:
            raise ChainError(
                0, "the chain is not signed, but a verifier was given; open it without certificates"
            )
        self._signed = signed
        rows = self._conn.execute("SELECT height, hash, raw FROM blocks ORDER BY height")
        for height, stored_hash, raw in rows:
            expected = self._head[0] + 1
            if height != expected:
                raise ChainError(expected, _missing(head_height, expected))
            if height > head_height:
                raise ChainError(
                    height, f"block {height} is beyond the head record ({head_height + 1} blocks)"
                )
            block = self._check(height, bytes(stored_hash), bytes(raw), verifier)
            if visit is not None:
                visit(block)
            self._head = (block.height, block.hash, block.time)
            self._tx_count += len(block.txs)
        self._check_head(head_height, head_hash)

    def _check(self, height: int, stored_hash: bytes, raw: bytes, verifier: VerifierLike | None) -> Block:
        try:
            block = decode_block(raw)
            self._check_link(block, height)
            if block.hash != stored_hash:
                raise BlockError("its hash does not match its contents")
            if verifier is not None:
                verify_signature(block, verifier)
            elif block.sig is not None:
                raise BlockError("it is signed, but the chain is not")
        except BlockError as exc:
            raise _corrupt(height, str(exc)) from None
        return block

    def _check_link(self, block: Block, height: int) -> None:
        if block.height != height:
            raise BlockError(f"it says it is block {block.height}")
        if block.prev_hash != self._head[1]:
            raise BlockError(f"it does not link to block {height - 1} (its previous hash differs)")
        if block.time < self._head[2]:
            raise BlockError(f"its time is earlier than block {height - 1}'s")

    def _check_head(self, head_height: int, head_hash: bytes) -> None:
        last = self._head[0]
        if last < head_height:
            raise ChainError(last + 1, _missing(head_height, last + 1))
        if head_hash != self._head[1]:
            raise ChainError(last, f"the head record's hash does not match block {last}")
        (indexed,) = self._conn.execute("SELECT COUNT(*) FROM txs").fetchone()
        if indexed != self._tx_count:
            raise ChainError(
                None, f"its index of {indexed} transactions does not match the {self._tx_count} in its blocks"
            )

    # --- state -----------------------------------------------------------------------------

    @property
    def height(self) -> int:
        """Height of the last block (-1 when there is none)."""
        return self._head[0]

    @property
    def head_hash(self) -> bytes:
        """Hash of the last block."""
        return self._head[1]

    @property
    def head_time(self) -> float:
        """Time of the last block."""
        return self._head[2]

    @property
    def signed(self) -> bool | None:
        """Whether the chain is signed (None before genesis)."""
        return self._signed

    # --- writing ---------------------------------------------------------------------------

    def append(self, block: Block) -> None:
        """Store ``block`` with its tx hashes and the new head record, in one durable transaction.

        Raises:
            ValueError: when the block does not extend the chain or breaks its signedness.
            StorageError: when SQLite cannot write it (a full disk, a read-only file); nothing was stored.
        """
        self._check_extends(block)
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO blocks VALUES (?, ?, ?)", (block.height, block.hash, block.raw))
            conn.executemany(
                "INSERT INTO txs VALUES (?, ?, ?)",
                ((tx_hash(raw), block.height, i) for i, raw in enumerate(block.txs)),
            )
            if block.height == 0:
                conn.execute("INSERT INTO meta VALUES ('signed', ?)", (b"\x01" if block.sig else b"\x00",))
            head = packb([block.height, block.hash, block.time])
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('head', ?)", (head,))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:  # SQLite may have rolled back already (a full disk does that)
            self._rollback()
            raise StorageError(f"cannot store block {block.height} in {self.path}: {exc}") from None
        except BaseException:
            self._rollback()
            raise
        if block.height == 0:
            self._signed = block.sig is not None
        self._head = (block.height, block.hash, block.time)
        self._tx_count += len(block.txs)

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _check_extends(self, block: Block) -> None:
        if block.height != self.height + 1 or block.prev_hash != self.head_hash:
            msg = f"block {block.height} does not extend the chain (head is block {self.height})"
            raise ValueError(msg)
        if block.time < self.head_time:
            msg = f"block {block.height}'s time is earlier than block {self.height}'s"
            raise ValueError(msg)
        if self._signed is not None and self._signed != (block.sig is not None):
            has, chain = ("signed" if block.sig else "unsigned"), ("signed" if self._signed else "unsigned")
            msg = f"block {block.height} is {has}, but the chain is {chain}"
            raise ValueError(msg)

    # --- reading ---------------------------------------------------------------------------

    def iter_blocks(self, start: int = 0) -> Iterator[Block]:
        """The stored blocks from ``start`` on, decoded (the chain was verified when opened)."""
        rows = self._conn.execute("SELECT raw FROM blocks WHERE height >= ? ORDER BY height", (start,))
        for (raw,) in rows:
            yield decode_block(bytes(raw))

    def get_raw(self, height: int) -> bytes | None:
        """The stored bytes of block ``height``, or None."""
        row = self._conn.execute("SELECT raw FROM blocks WHERE height = ?", (height,)).fetchone()
        return None if row is None else bytes(row[0])

    def raw_range(self, start: int, end: int) -> list[bytes]:
        """The stored bytes of blocks ``start`` to ``end - 1``."""
        rows = self._conn.execute(
            "SELECT raw FROM blocks WHERE height >= ? AND height < ? ORDER BY height", (start, end)
        )
        return [bytes(raw) for (raw,) in rows]

    def tx_locations(self, hashes: Sequence[bytes]) -> dict[bytes, tuple[int, int]]:
        """Where the transactions with these hashes are stored: ``hash -> (height, index)``."""
        out: dict[bytes, tuple[int, int]] = {}
        for digest in hashes:
            row = self._conn.execute("SELECT height, idx FROM txs WHERE hash = ?", (digest,)).fetchone()
            if row is not None:
                out[digest] = (int(row[0]), int(row[1]))
        return out

    def close(self) -> None:
        """Close the database."""
        self._conn.close()


def _missing(head_height: int, height: int) -> str:
    return f"head record says {head_height + 1} blocks but block {height} is missing"

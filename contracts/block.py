"""Blocks: header, hash, tx root and the sealer's signature; encoding and checks of one block.

``header = msgpack([version, height, prev_hash, time, sealer, tx_root])``, ``tx_root =
sha256(msgpack(list of tx envelope bytes))``, ``hash = sha256(header)``, ``sig = sign(hash)``. A block
travels and is stored as ``msgpack([header, txs, sig, cert])`` (``cert``: the sealer's certificate).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeGuard

import msgpack

from wire.envelope import SignerLike, VerifierLike
from wire.errors import CodecError
from wire.limits import packb

__all__ = [
    "BLOCK_VERSION",
    "GENESIS_PREV",
    "MAX_HEIGHT",
    "Block",
    "BlockError",
    "decode_block",
    "is_height",
    "make_block",
    "tx_hash",
    "tx_root",
    "verify_signature",
]

BLOCK_VERSION = 1
GENESIS_PREV = bytes(32)
MAX_BLOCK_BYTES = 256 * 1024 * 1024
MAX_HEIGHT = 2**53  # the highest block height a request may name


def is_height(value: object) -> TypeGuard[int]:
    """Whether ``value`` is a block height a request may name: an integer (not a bool), 0..MAX_HEIGHT."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_HEIGHT


class BlockError(ValueError):
    """What is wrong with one block (the store adds which block and which ledger)."""


@dataclass(frozen=True, slots=True)
class Block:
    """A decoded block; ``hash`` is computed from ``header`` (the exact header bytes)."""

    height: int
    prev_hash: bytes
    time: float
    sealer: str
    tx_root: bytes
    txs: tuple[bytes, ...]
    sig: bytes | None
    cert: bytes | None
    header: bytes
    hash: bytes

    @property
    def raw(self) -> bytes:
        """The block's wire and storage form."""
        return packb([self.header, list(self.txs), self.sig, self.cert])


def tx_hash(envelope: bytes) -> bytes:
    """The identity of a transaction: sha256 of its envelope bytes."""
    return hashlib.sha256(envelope).digest()


def tx_root(txs: Sequence[bytes]) -> bytes:
    """sha256 of the msgpack list of the transactions' envelope bytes."""
    return hashlib.sha256(packb(list(txs))).digest()


def make_block(
    height: int,
    prev_hash: bytes,
    time: float,
    sealer: str,
    txs: Sequence[bytes],
    signer: SignerLike | None,
) -> Block:
    """Build (and sign, when ``signer`` is given) the block holding ``txs``."""
    root = tx_root(txs)
    header = packb([BLOCK_VERSION, height, prev_hash, float(time), sealer, root])
    digest = hashlib.sha256(header).digest()
    sig = signer.sign(digest) if signer is not None else None
    cert = signer.cert_der if signer is not None else None
    return Block(height, prev_hash, float(time), sealer, root, tuple(txs), sig, cert, header, digest)


def _unpack(data: bytes, what: str) -> object:
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_bin_len=MAX_BLOCK_BYTES,
            max_str_len=1024,
            max_array_len=10_000_000,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several types on garbage
        msg = f"its {what} cannot be decoded ({type(exc).__name__})"
        raise BlockError(msg) from None


def _parse_header(header: bytes) -> tuple[int, bytes, float, str, bytes]:
    fields = _unpack(header, "header")
    if not isinstance(fields, list) or len(fields) != 6:
        raise BlockError("its header is not a list of 6 fields")
    version, height, prev, when, sealer, root = fields
    if version != BLOCK_VERSION or isinstance(version, bool):
        raise BlockError(f"its version {version!r} is not supported (expected {BLOCK_VERSION})")
    if not isinstance(height, int) or isinstance(height, bool) or height < 0:
        raise BlockError("its height is not a non-negative integer")
    if not isinstance(prev, bytes) or len(prev) != 32 or not isinstance(root, bytes) or len(root) != 32:
        raise BlockError("its previous hash or tx root is not 32 bytes")
    if not isinstance(when, float) or not math.isfinite(when):
        raise BlockError("its time is not a finite float")
    if not isinstance(sealer, str) or not sealer:
        raise BlockError("its sealer is not a uid")
    return height, prev, when, sealer, root


def decode_block(raw: bytes) -> Block:
    """Decode a block and check that it is internally consistent (its tx root matches its txs).

    Raises:
        BlockError: saying what is wrong.
    """
    parts = _unpack(raw, "encoding")
    if not isinstance(parts, list) or len(parts) != 4:
        raise BlockError("its encoding is not [header, txs, sig, cert]")
    header, txs, sig, cert = parts
    if not isinstance(header, bytes):
        raise BlockError("its header is not bytes")
    if not isinstance(txs, list) or not all(isinstance(t, bytes) for t in txs):
        raise BlockError("its transactions are not a list of envelopes")
    if not (sig is None or isinstance(sig, bytes)) or not (cert is None or isinstance(cert, bytes)):
        raise BlockError("its signature or certificate is not bytes")
    if (sig is None) != (cert is None):
        raise BlockError("it has a signature without a certificate, or the reverse")
    height, prev, when, sealer, root = _parse_header(header)
    if tx_root(txs) != root:
        raise BlockError("its transactions do not match its tx root")
    digest = hashlib.sha256(header).digest()
    return Block(height, prev, when, sealer, root, tuple(txs), sig, cert, header, digest)


def verify_signature(block: Block, verifier: VerifierLike) -> None:
    """Check the sealer's signature over the block hash, and that the sealer is an SN.

    Raises:
        BlockError: when the block is unsigned or the signature does not verify.
    """
    if block.sig is None or block.cert is None:
        raise BlockError("it is not signed, but the chain is")
    try:
        role = verifier.verify(block.hash, block.sig, block.cert, block.sealer)
    except CodecError as exc:
        raise BlockError(f"its sealer signature does not verify ({exc})") from None
    except Exception as exc:  # a malformed certificate may raise anything from the crypto library
        msg = f"its sealer signature does not verify ({type(exc).__name__}: {exc})"
        raise BlockError(msg) from None
    if role != "sn":
        raise BlockError(f"its sealer {block.sealer!r} is a {role} node, not an SN")

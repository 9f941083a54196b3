"""The SN's local copy of the chain: where it is stored, how blocks are verified, and the lock around it.

The SN node owns one; the sealer and the replica both work on it (and never on the node itself).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from contracts.ledger import Ledger
from wire import VerifierLike

__all__ = ["LocalChain"]


@dataclass
class LocalChain:
    """The ledger file of one SN, its verifier, and the lock that serialises writes and block reads."""

    path: Path
    verifier: VerifierLike | None
    ledger: Ledger | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

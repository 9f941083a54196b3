"""The ledger: a pure, deterministic state machine and its hash-chained block store (docs/ledger.md).

``machine.apply(state, tx)`` gives the next state or a ``Rejection``; ``Ledger`` seals envelopes into
blocks in SQLite, verifies the chain when opened and replays it; ``views``/``query`` answer the reads
of the swci shell.

It may import ``wire`` and ``taskdefs`` (to check task bodies), never an actor: it runs anywhere.
"""

from contracts.blockstore import BlockStore, ChainError, LedgerError, StorageError
from contracts.ledger import Accepted, Ledger, SealResult
from contracts.machine import (
    DEFAULT_CONTRACT,
    DEFAULT_TASKRUNNER,
    ROOT_TASK,
    apply,
    changed_entities,
    due_actions,
    genesis_transactions,
    next_deadline,
    receipt,
)
from contracts.state import EMPTY_STATE, State, state_hash
from contracts.tx import Rejection, Tx, tx_from_envelope
from contracts.views import QueryError, entity_view, query

__all__ = [
    "DEFAULT_CONTRACT",
    "DEFAULT_TASKRUNNER",
    "EMPTY_STATE",
    "ROOT_TASK",
    "Accepted",
    "BlockStore",
    "ChainError",
    "Ledger",
    "LedgerError",
    "StorageError",
    "QueryError",
    "Rejection",
    "SealResult",
    "State",
    "Tx",
    "apply",
    "changed_entities",
    "due_actions",
    "entity_view",
    "genesis_transactions",
    "next_deadline",
    "query",
    "receipt",
    "state_hash",
    "tx_from_envelope",
]

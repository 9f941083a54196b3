"""The ledger's state: immutable entities, copy-on-write helpers and the canonical state hash.

Every entity is a frozen dataclass and every mapping is treated as immutable: a rule that changes
something builds a new mapping for the one collection it touches (``put``/``drop``) and shares the rest,
so applying a transaction costs about the size of what it changes, and unchanged entities keep their
identity (which is how ``changed_entities`` finds what changed).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from contracts.trial_state import Study
from wire.limits import packb

__all__ = [
    "ACTIVE",
    "COMPLETE",
    "EMPTY_STATE",
    "UNINITIALIZED",
    "Assignment",
    "Checkin",
    "Contract",
    "Enrollment",
    "Member",
    "MergePolicy",
    "ModelRef",
    "Node",
    "Params",
    "PeerStatus",
    "Revocation",
    "Round",
    "Rounds",
    "State",
    "Task",
    "TaskRunner",
    "drop",
    "put",
    "state_hash",
    "to_plain",
]

STATE_FORMAT = 1
UNINITIALIZED = "UNINITIALIZED"
ACTIVE = "ACTIVE"
COMPLETE = "COMPLETE"

K = TypeVar("K")
V = TypeVar("V")


def put(mapping: Mapping[K, V], key: K, value: V) -> dict[K, V]:
    """A copy of ``mapping`` with ``key`` set to ``value``."""
    out = dict(mapping)
    out[key] = value
    return out


def drop(mapping: Mapping[K, V], key: K) -> dict[K, V]:
    """A copy of ``mapping`` without ``key``."""
    out = dict(mapping)
    out.pop(key, None)
    return out


@dataclass(frozen=True, slots=True)
class Node:
    """A process on the bus that registered itself."""

    uid: str
    role: str
    parent: str | None
    host: str
    address: str
    pid: int | None
    meta: Mapping[str, Any]
    online: bool
    registered_at: float
    last_seen: float
    offline_reason: str = ""
    identity: str = ""
    session: str = ""


@dataclass(frozen=True, slots=True)
class Revocation:
    """An identity (certificate CN) an administrator revoked: refused from then on."""

    identity: str
    by: str
    time: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Params:
    """What an SL declared when it joined a contract (its ``SwarmCallback`` settings)."""

    sync_frequency: int
    min_peers: int
    node_weightage: float
    merge_method: str
    total_epochs: int
    admin: bool
    quorum_wait: float
    leader_timeout: float
    secure_aggregation: bool = False  # the mean merge by masked rows (docs/privacy.md)
    trim_ratio: float = 0.1
    max_update_norm: float = 0.0
    straggler_timeout: float = 600.0  # silent this long once the others finished: skipped (rounds.py)


@dataclass(frozen=True, slots=True)
class MergePolicy:
    """How a contract merges, pinned by its first join: the method and its options.

    ``max_update_norm``: the largest L2 norm of a row's update (its distance to the previous merged
    model) that a leader merges; 0 means no bound.
    """

    method: str
    trim_ratio: float
    max_update_norm: float
    set_by: str


@dataclass(frozen=True, slots=True)
class Member:
    """An SL's membership of a contract with its PERFDATA; status ``active``/``finished``/``left``."""

    uid: str
    status: str
    params: Params
    joined_at: float
    updated_at: float
    epochs_done: int = 0
    total_epochs: int = 0
    loss: float | None = None
    metric: float | None = None
    epsilon: float | None = None  # differential privacy spent by the site so far (None: DP off)
    done_mode: str | None = None
    left_reason: str = ""
    excluded: int = 0
    excluded_reason: str = ""


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A merged model: the round that made it, its digest and the leader that holds it."""

    round: int
    digest: str
    leader: str
    time: float


@dataclass(frozen=True, slots=True)
class Contract:
    """A training contract (status ``UNINITIALIZED``/``ACTIVE``/``COMPLETE``); rounds live in ``Rounds``."""

    name: str
    status: str
    created_at: float
    created_by: str
    members: Mapping[str, Member] = field(default_factory=dict)
    latest_model: ModelRef | None = None
    final_digest: str | None = None
    completed_at: float | None = None
    resets: int = 0
    layout: tuple[tuple[str, str, tuple[int, ...]], ...] | None = None
    merge: MergePolicy | None = None
    exclusions: int = 0
    last_exclusion: str = ""


@dataclass(frozen=True, slots=True)
class Checkin:
    """One SL's model offered to a round."""

    uid: str
    digest: str
    samples: int
    weight: float
    init: bool
    time: float


@dataclass(frozen=True, slots=True)
class Round:
    """A sync round: ``OPEN`` → ``CLOSED`` (participants and leader fixed) → ``MERGED`` or ``ABANDONED``."""

    number: int
    status: str
    opened_at: float
    checkins: Mapping[str, Checkin] = field(default_factory=dict)
    quorum_at: float | None = None
    final: bool = False
    init: bool = False
    participants: tuple[str, ...] = ()
    candidates: tuple[str, ...] = ()
    leader: str | None = None
    failed: tuple[str, ...] = ()
    leader_timeout: float = 0.0
    leader_deadline: float | None = None
    closed_at: float | None = None
    ended_at: float | None = None
    digest: str | None = None
    contributors: tuple[str, ...] = ()
    reason: str = ""
    excluded: tuple[tuple[str, str], ...] = ()  # (uid, why) of rows the leader left out


@dataclass(frozen=True, slots=True)
class Rounds:
    """The rounds of one contract: the open one, closed ones awaiting a merge, the last few finished."""

    open: Round | None = None
    pending: tuple[Round, ...] = ()
    done: tuple[Round, ...] = ()


@dataclass(frozen=True, slots=True)
class Task:
    """A task definition; ``body`` is ``(idx, line)`` pairs sorted by idx."""

    name: str
    type: str
    author: str
    prereq: str
    outcome: str
    body: tuple[tuple[int, str], ...]
    finalized: bool
    created_at: float
    created_by: str
    finalized_at: float | None = None

    @property
    def lines(self) -> list[str]:
        """The consolidated body, in idx order."""
        return [line for _, line in self.body]


@dataclass(frozen=True, slots=True)
class Enrollment:
    """A SWOP listening on a taskrunner; ``capacity`` is its number of ``slnodedef``s."""

    uid: str
    capacity: int
    group: str
    enrolled_at: float
    grace: float = 120.0


@dataclass(frozen=True, slots=True)
class PeerStatus:
    """The last reported status of one peer (an SL, or the SWOP itself)."""

    peer: str
    peer_type: str
    status: str
    description: str
    exit_code: int | None
    time: float


@dataclass(frozen=True, slots=True)
class Assignment:
    """A task assigned to a taskrunner: what each SWOP must run and what they reported."""

    task: str
    task_type: str
    peers: int | str | None
    target: str | None
    required: int
    allocation: Mapping[str, int]
    assigned_at: float
    generation: int = 1
    statuses: Mapping[str, Mapping[str, PeerStatus]] = field(default_factory=dict)
    updated_at: float = 0.0
    orphaned_at: float | None = None


@dataclass(frozen=True, slots=True)
class TaskRunner:
    """A taskrunner: ``IDLE``/``RUNNING``/``COMPLETE``/``ERROR``."""

    name: str
    state: str
    created_at: float
    created_by: str
    enrolled: Mapping[str, Enrollment] = field(default_factory=dict)
    assignment: Assignment | None = None
    error: str = ""
    finished_at: float | None = None


@dataclass(frozen=True, slots=True)
class State:
    """Everything the ledger knows, by entity kind and key."""

    nodes: Mapping[str, Node] = field(default_factory=dict)
    contracts: Mapping[str, Contract] = field(default_factory=dict)
    rounds: Mapping[str, Rounds] = field(default_factory=dict)
    tasks: Mapping[str, Task] = field(default_factory=dict)
    taskrunners: Mapping[str, TaskRunner] = field(default_factory=dict)
    revoked: Mapping[str, Revocation] = field(default_factory=dict)
    studies: Mapping[str, Study] = field(default_factory=dict)


EMPTY_STATE = State()


_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})
_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}  # per type: its dataclass fields, None if not one


def to_plain(obj: Any) -> Any:
    """Plain msgpack data for an entity: dataclasses as maps in field order, mappings as maps with
    sorted keys, sequences as lists."""
    kind = type(obj)
    if kind in _SCALARS:  # most of a state: checked first, by exact type (a state hash walks it all)
        return obj
    if kind is not dict and kind is not list and kind is not tuple:
        names = _field_names(kind)
        if names is not None:
            return {name: to_plain(getattr(obj, name)) for name in names}
    if isinstance(obj, Mapping):
        return {str(k): to_plain(obj[k]) for k in sorted(obj, key=str)}
    if isinstance(obj, tuple | list):
        return [to_plain(item) for item in obj]
    return obj


def _field_names(kind: type) -> tuple[str, ...] | None:
    if kind not in _FIELD_NAMES:
        is_one = dataclasses.is_dataclass(kind)
        _FIELD_NAMES[kind] = tuple(f.name for f in dataclasses.fields(kind)) if is_one else None
    return _FIELD_NAMES[kind]


def state_hash(state: State) -> bytes:
    """SHA-256 of the canonical msgpack form of ``state`` (map keys sorted at every level)."""
    return hashlib.sha256(packb([STATE_FORMAT, to_plain(state)])).digest()

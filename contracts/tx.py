"""Transactions as the state machine sees them: kinds, roles and body schemas, and their checks."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from contracts import fields as f
from contracts import trial_fields
from wire.envelope import Envelope

__all__ = [
    "ADMIN_ROLES",
    "DEFAULT_OFFLINE_GRACE",
    "KINDS",
    "SENT_TWICE",
    "TASK_TYPES",
    "TX_PREFIX",
    "KindSpec",
    "RejectError",
    "Rejection",
    "Tx",
    "check_tx",
    "duplicate_block",
    "duplicate_rejection",
    "is_duplicate",
    "tx_from_envelope",
    "tx_from_wire",
]

TX_PREFIX = "tx:"
ADMIN_ROLES = frozenset({"swci", "sn"})  # the SN administers too: it seals genesis
# Seconds a RUNNING assignment survives with every one of its SWOPs offline (a partition, a restart).
DEFAULT_OFFLINE_GRACE = 120.0
TASK_TYPES = (
    "RUN_SWARM",
    "RUN_TRIALS",
    "MAKE_USER_CONTAINER",
    "MAKE_USER_ENV",
    "MAKE_SWARM_USER_CONTENT",
    "PULL_IMAGE",
    "ROOT",
)
PEER_STATUSES = ("STARTING", "RUNNING", "COMPLETED", "FAILED")


@dataclass(frozen=True, slots=True)
class Tx:
    """One transaction: ``kind`` without the ``tx:`` prefix; ``time`` is the block time.

    ``identity``: the certificate (CN) the sender signed with; "" means the sender itself.
    """

    kind: str
    sender: str
    role: str
    body: Mapping[str, Any]
    time: float
    identity: str = ""

    @property
    def signer(self) -> str:
        """The identity that signed: ``identity``, or the sender when it speaks for itself."""
        return self.identity or self.sender


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a transaction was not applied, written for the user."""

    reason: str


_DUPLICATE_OF = "duplicate transaction: this exact envelope is already transaction"
_DUPLICATE_BLOCK = re.compile(re.escape(_DUPLICATE_OF) + r" \d+ of block (\d+)")
SENT_TWICE = "duplicate transaction: this exact envelope was sent twice in one batch"


def duplicate_rejection(index: int, height: int) -> Rejection:
    """An envelope the ledger holds already, as transaction ``index`` of block ``height``."""
    return Rejection(f"{_DUPLICATE_OF} {index} of block {height}")


def duplicate_block(reason: str) -> int | None:
    """The block that holds an envelope, from the reason the ledger gave for refusing it again; None
    for any other reason."""
    found = _DUPLICATE_BLOCK.search(reason)
    return int(found.group(1)) if found else None


def is_duplicate(reason: str) -> bool:
    """Whether the ledger refused an envelope because it holds it already: sealed in an earlier block, or
    accepted in the same block as its twin."""
    return duplicate_block(reason) is not None or SENT_TWICE in reason


class RejectError(Exception):
    """Raised inside the rules; ``apply`` turns it into a ``Rejection``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class KindSpec:
    """Who may send a kind and the fields of its body."""

    roles: frozenset[str] | None  # None: any role
    fields: Mapping[str, f.Field]


def _params(value: Any) -> dict[str, Any]:
    return f.check_fields(f.plain_map(value), _PARAM_FIELDS)


def _trim_ratio(value: Any) -> float:
    ratio = float(f.number(0.0)(value))
    if ratio >= 0.5:
        raise f.BadValue(f"must be below 0.5 (trimmedmean keeps the middle rows), got {ratio}")
    return ratio


_MAX_EXCLUDED = 10_000


def _excluded(value: Any) -> tuple[tuple[str, str], ...]:
    """Rows a leader left out: a list of ``{uid, reason}``, each node at most once."""
    if not isinstance(value, list) or len(value) > _MAX_EXCLUDED:
        raise f.BadValue(f"must be a list of at most {_MAX_EXCLUDED} {{uid, reason}} maps, got {value!r:.40}")
    out = []
    for i, item in enumerate(value):
        try:
            entry = f.check_fields(f.plain_map(item), _EXCLUSION_FIELDS)
        except f.FieldError as exc:
            raise f.BadValue(f"entry {i}: {exc}") from None
        except f.BadValue as exc:
            raise f.BadValue(f"entry {i} {exc}") from None
        out.append((entry["uid"], entry["reason"]))
    if len({uid for uid, _ in out}) != len(out):
        raise f.BadValue("must not name a node twice")
    return tuple(out)


_EXCLUSION_FIELDS: Mapping[str, f.Field] = {"uid": f.Field(f.name), "reason": f.Field(f.text(300))}


def _peers(value: Any) -> int | str:
    if isinstance(value, str) and value.upper() == "ALL":
        return "ALL"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        msg = f"must be a number of peers (1-100000) or 'ALL', got {value!r}"
        raise f.BadValue(msg)
    return value


_PARAM_FIELDS: Mapping[str, f.Field] = {
    "sync_frequency": f.Field(f.integer(1), 128),
    "min_peers": f.Field(f.integer(1, 10_000), 1),
    "node_weightage": f.Field(f.number(0.0), 1.0),
    "merge_method": f.Field(f.text(32), "mean"),
    "total_epochs": f.Field(f.integer(0), 0),
    "admin": f.Field(f.boolean, True),
    "quorum_wait": f.Field(f.number(0.0), 30.0),
    "leader_timeout": f.Field(f.number(0.001), 600.0),
    "secure_aggregation": f.Field(f.boolean, False),
    "trim_ratio": f.Field(_trim_ratio, 0.1),
    "max_update_norm": f.Field(f.number(0.0), 0.0),
    "straggler_timeout": f.Field(f.number(0.001), 600.0),
}

_CONTRACT = {"contract": f.Field(f.name)}
_ROUND = {"contract": f.Field(f.name), "round": f.Field(f.integer(1))}
_SL = frozenset({"sl"})
_SN = frozenset({"sn"})
_SWOP = frozenset({"swop"})

KINDS: Mapping[str, KindSpec] = {
    "node.register": KindSpec(
        None,
        {
            "role": f.Field(f.optional(f.text(16)), None),
            "parent": f.Field(f.optional(f.name), None),
            "host": f.Field(f.text(255), ""),
            "address": f.Field(f.text(255), ""),
            "pid": f.Field(f.optional(f.integer(0)), None),
            "meta": f.Field(f.plain_map, {}),
            "session": f.Field(f.text(64), ""),
        },
    ),
    "node.offline": KindSpec(
        _SN,
        {"uid": f.Field(f.name), "reason": f.Field(f.text(500), ""), "session": f.Field(f.text(64), "")},
    ),
    "identity.revoke": KindSpec(
        ADMIN_ROLES, {"identity": f.Field(f.name), "reason": f.Field(f.text(500), "")}
    ),
    "contract.create": KindSpec(ADMIN_ROLES, {"name": f.Field(f.name)}),
    "contract.reset": KindSpec(ADMIN_ROLES, {"name": f.Field(f.name)}),
    "contract.join": KindSpec(
        _SL,
        {**_CONTRACT, "params": f.Field(_params, _params({})), "layout": f.Field(f.optional(f.layout), None)},
    ),
    "contract.progress": KindSpec(
        _SL,
        {
            **_CONTRACT,
            "epochs_done": f.Field(f.integer(0)),
            "total_epochs": f.Field(f.integer(0)),
            "loss": f.Field(f.optional(f.number(float("-inf"), finite=False)), None),
            "metric": f.Field(f.optional(f.number(float("-inf"), finite=False)), None),
            "epsilon": f.Field(f.optional(f.number(0.0)), None),  # differential privacy spent so far
        },
    ),
    "contract.done": KindSpec(
        _SL, {**_CONTRACT, "mode": f.Field(f.one_of("snapshot", "active", "inactive"), "snapshot")}
    ),
    "round.checkin": KindSpec(
        _SL,
        {
            **_CONTRACT,
            "digest": f.Field(f.digest),
            "samples": f.Field(f.integer(0), 0),
            "weight": f.Field(f.number(0.0), 1.0),
            "init": f.Field(f.boolean, False),
        },
    ),
    "round.close": KindSpec(_SN, _ROUND),
    "round.merged": KindSpec(
        _SL,
        {
            **_ROUND,
            "digest": f.Field(f.digest),
            "contributors": f.Field(f.uid_list),
            "excluded": f.Field(_excluded, ()),
            "taken": f.Field(f.boolean, False),  # every other participant holds the merge already
        },
    ),
    "round.failed": KindSpec(
        _SL, {**_ROUND, "reason": f.Field(f.text(500)), "excluded": f.Field(_excluded, ())}
    ),
    "round.leader_timeout": KindSpec(_SN, _ROUND),
    "round.skip_straggler": KindSpec(_SN, {**_CONTRACT, "uid": f.Field(f.name)}),
    "task.create": KindSpec(
        ADMIN_ROLES,
        {
            "name": f.Field(f.name),
            "type": f.Field(f.one_of(*TASK_TYPES, fold=True)),
            "author": f.Field(f.text()),
            "prereq": f.Field(f.text(), ""),
            "outcome": f.Field(f.text(), ""),
            "body": f.Field(f.optional(f.lines), None),
        },
    ),
    "task.append": KindSpec(
        ADMIN_ROLES,
        {"name": f.Field(f.name), "idx": f.Field(f.integer(1, 10_000)), "line": f.Field(f.text(8192))},
    ),
    "task.finalize": KindSpec(ADMIN_ROLES, {"name": f.Field(f.name)}),
    "task.delete": KindSpec(ADMIN_ROLES, {"name": f.Field(f.name)}),
    "taskrunner.create": KindSpec(ADMIN_ROLES, {"name": f.Field(f.name)}),
    "taskrunner.enroll": KindSpec(
        _SWOP,
        {
            "taskrunner": f.Field(f.name),
            "capacity": f.Field(f.integer(0, 10_000)),
            "group": f.Field(f.text(), ""),
            "grace": f.Field(f.number(0.0), DEFAULT_OFFLINE_GRACE),
        },
    ),
    "taskrunner.assign": KindSpec(
        ADMIN_ROLES,
        {
            "task": f.Field(f.name),
            "taskrunner": f.Field(f.name),
            "peers": f.Field(f.optional(_peers), None),
            "target": f.Field(f.optional(f.name), None),
        },
    ),
    "taskrunner.status": KindSpec(
        frozenset({"swop", "sl"}),  # an SL reports itself only when its SWOP is gone (taskrunners.py)
        {
            "taskrunner": f.Field(f.name),
            "peer": f.Field(f.name),
            "peer_type": f.Field(f.one_of("SL", "SWOP", fold=True)),
            "status": f.Field(f.one_of(*PEER_STATUSES, fold=True)),
            "description": f.Field(f.text(2000), ""),
            "exit_code": f.Field(f.optional(f.integer(-(2**31), 2**31)), None),
        },
    ),
    "taskrunner.reset": KindSpec(ADMIN_ROLES, {"taskrunner": f.Field(f.name)}),
    "taskrunner.orphaned": KindSpec(_SN, {"taskrunner": f.Field(f.name)}),
    "trial.plan": KindSpec(_SWOP, trial_fields.PLAN),
    "trial.claim": KindSpec(_SWOP, trial_fields.CLAIM),
    "trial.result": KindSpec(_SWOP, trial_fields.RESULT),
}


def check_tx(tx: Tx) -> Tx:
    """Check the kind, the sender's role and the body; return the tx with its body normalised.

    Raises:
        RejectError: saying which kind, role or field is wrong.
    """
    spec = KINDS.get(tx.kind)
    if spec is None:
        raise RejectError(f"unknown transaction kind {tx.kind!r} (known: {', '.join(KINDS)})")
    if spec.roles is not None and tx.role not in spec.roles:
        roles = " or ".join(sorted(spec.roles))
        raise RejectError(f"tx:{tx.kind} must come from a node of role {roles}, not {tx.role} {tx.sender!r}")
    try:
        body = f.check_fields(tx.body, spec.fields)
    except f.FieldError as exc:
        raise RejectError(f"tx:{tx.kind}: {exc}") from None
    return Tx(tx.kind, tx.sender, tx.role, body, tx.time, tx.identity)


def tx_from_envelope(env: Envelope, time: float) -> Tx | Rejection:
    """The transaction an envelope of kind ``tx:<kind>`` carries, stamped with the block ``time``."""
    if not env.kind.startswith(TX_PREFIX):
        return Rejection(f"envelope kind {env.kind!r} is not a transaction (tx:<kind>)")
    kind = env.kind[len(TX_PREFIX) :]
    if kind not in KINDS:
        return Rejection(f"unknown transaction kind {kind!r} (known: {', '.join(KINDS)})")
    return Tx(kind, env.sender, env.role, env.body, time, env.voucher or "")


def tx_from_wire(raw: bytes, time: float) -> Tx:
    """Fast decode of an envelope already verified when its block was sealed (replay only).

    Raises:
        ValueError: when the bytes are not an envelope (a corrupt chain).
    """
    try:
        env = msgpack.unpackb(raw, raw=False, strict_map_key=True)
        body = msgpack.unpackb(env["b"], raw=False, strict_map_key=True)
        kind, sender, role, voucher = env["k"], env["s"], env["r"], env.get("i")
    except Exception as exc:
        msg = f"not a transaction envelope ({type(exc).__name__}: {exc})"
        raise ValueError(msg) from None
    if not isinstance(kind, str) or not kind.startswith(TX_PREFIX) or not isinstance(body, dict):
        msg = f"not a transaction envelope (kind {kind!r})"
        raise ValueError(msg)
    return Tx(kind[len(TX_PREFIX) :], str(sender), str(role), body, time, str(voucher or ""))

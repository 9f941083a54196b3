"""The ledger's record of a ``RUN_TRIALS`` study: its trials, their attempts and their results."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DONE", "Attempt", "Part", "Study", "Trial"]

DONE = ("COMPLETED", "FAILED")


@dataclass(frozen=True, slots=True)
class Part:
    """One SWOP's share of a ``SWARM``-mode attempt: its SL nodes' run, and how it ended."""

    swop: str
    joined_at: float
    status: str = "RUNNING"
    ended_at: float | None = None
    exit_code: int | None = None
    description: str = ""
    nodes: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    probabilities: tuple[tuple[float, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a trial: on which SWOP and slot, and how it ended (``RUNNING`` until it does).

    In ``SWARM`` mode ``swop`` is the SWOP that started the attempt and ``slot`` is ``swarm``;
    ``contract`` is the training contract the ledger created for it, ``swops`` the SWOPs expected to
    take part (those of the assignment online when it started) and ``parts`` those that joined.
    """

    swop: str
    slot: str
    started_at: float
    status: str = "RUNNING"
    ended_at: float | None = None
    exit_code: int | None = None
    description: str = ""
    contract: str = ""
    swops: tuple[str, ...] = ()
    parts: tuple[Part, ...] = ()


@dataclass(frozen=True, slots=True)
class Trial:
    """One point of the search: ``PENDING`` → ``RUNNING`` → ``COMPLETED``, or ``FAILED`` once its
    attempts are spent (a failed attempt with retries left makes it ``PENDING`` again).

    In ``SWARM`` mode ``metrics`` is the mean over every node of the completed attempt of each metric
    that all of them reported, and ``node_metrics`` what each node reported."""

    index: int
    params: Mapping[str, bool | int | float | str]
    status: str = "PENDING"
    attempts: tuple[Attempt, ...] = ()
    metrics: Mapping[str, float] = field(default_factory=dict)
    probabilities: tuple[tuple[float, ...], ...] = ()
    node_metrics: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Study:
    """The trials of one assignment of a ``RUN_TRIALS`` task (keyed by the task's name)."""

    task: str
    taskrunner: str
    assigned_at: float
    kind: str
    mode: str
    metric: str
    goal: str
    retries: int
    trials: tuple[Trial, ...]
    planned_at: float
    planned_by: str
    probes: tuple[tuple[float, ...], ...] = ()
    finished_at: float | None = None

    @property
    def finished(self) -> bool:
        """Whether every trial has ended (completed, or failed with no retry left)."""
        return all(t.status in DONE for t in self.trials)

"""Read-only views of trial studies (``LIST TRIALS``, ``GET BEST TRIAL``, ``PLOT TRIALS``)."""

from __future__ import annotations

from typing import Any

from contracts.state import State
from contracts.trial_state import Attempt, Study, Trial
from contracts.trials import best_trial

__all__ = ["StudyNotFound", "list_studies", "study_best", "study_brief", "study_view"]

View = dict[str, Any]
_STATUSES = ("PENDING", "RUNNING", "COMPLETED", "FAILED")


class StudyNotFound(LookupError):
    """No study for the task named."""


def _study(state: State, task: str) -> Study:
    study = state.studies.get(task)
    if study is None:
        raise StudyNotFound(f"task {task!r} has no trials (ASSIGN a RUN_TRIALS task to run some)")
    return study


def _counts(study: Study) -> dict[str, int]:
    return {status: sum(t.status == status for t in study.trials) for status in _STATUSES}


def study_brief(state: State, task: str) -> View:
    """A study's progress (the event view): counts by status and whether it has finished."""
    study = _study(state, task)
    best = best_trial(study)
    return {
        "task": study.task,
        "taskrunner": study.taskrunner,
        "assigned_at": study.assigned_at,
        "kind": study.kind,
        "metric": study.metric,
        "goal": study.goal,
        "trials": len(study.trials),
        "counts": _counts(study),
        "finished": study.finished,
        "finished_at": study.finished_at,
        "best": None if best is None else best.index,
    }


def _trial_view(trial: Trial, detail: bool) -> View:
    last = trial.attempts[-1] if trial.attempts else None
    failed = [a for a in trial.attempts if a.status == "FAILED"]
    view: View = {
        "index": trial.index,
        "params": dict(trial.params),
        "status": trial.status,
        "attempts": len(trial.attempts),
        "failures": len(failed),
        "swop": last.swop if last else None,
        "slot": last.slot if last else None,
        "started_at": last.started_at if last else None,
        "ended_at": last.ended_at if last else None,
        "metrics": dict(trial.metrics),
        "last_error": failed[-1].description if failed else "",
        "last_exit_code": failed[-1].exit_code if failed else None,
    }
    if last is not None and last.contract:
        view["contract"] = last.contract
    if detail:
        view["probabilities"] = [list(row) for row in trial.probabilities]
        view["history"] = [_attempt_view(a) for a in trial.attempts]
        if trial.node_metrics:
            view["nodes"] = {uid: dict(m) for uid, m in trial.node_metrics.items()}
    return view


def _attempt_view(attempt: Attempt) -> View:
    view: View = {
        "swop": attempt.swop,
        "slot": attempt.slot,
        "status": attempt.status,
        "started_at": attempt.started_at,
        "ended_at": attempt.ended_at,
        "exit_code": attempt.exit_code,
        "description": attempt.description,
    }
    if attempt.contract:
        view["contract"] = attempt.contract
        view["swops"] = list(attempt.swops)
        view["parts"] = [
            {
                "swop": p.swop,
                "status": p.status,
                "joined_at": p.joined_at,
                "ended_at": p.ended_at,
                "exit_code": p.exit_code,
                "description": p.description,
                "nodes": {uid: dict(m) for uid, m in p.nodes.items()},
            }
            for p in attempt.parts
        ]
    return view


def study_view(state: State, task: str, detail: bool = False) -> View:
    """Every trial of a study with its parameters, status and metrics (and, with ``detail``, its
    attempts and predicted probabilities, plus the study's probe samples)."""
    study = _study(state, task)
    view = study_brief(state, task)
    view.update(
        mode=study.mode,
        retries=study.retries,
        planned_at=study.planned_at,
        planned_by=study.planned_by,
        trials=[_trial_view(t, detail) for t in study.trials],
    )
    if detail:
        view["probes"] = [list(row) for row in study.probes]
    return view


def study_best(state: State, task: str) -> View:
    """The best completed trial of a study by its metric and goal."""
    study = _study(state, task)
    best = best_trial(study)
    return {
        "task": study.task,
        "metric": study.metric,
        "goal": study.goal,
        "finished": study.finished,
        "counts": _counts(study),
        "best": None if best is None else _trial_view(best, detail=False),
    }


def list_studies(state: State) -> list[View]:
    """Every study, by task name."""
    return [study_brief(state, task) for task in sorted(state.studies)]

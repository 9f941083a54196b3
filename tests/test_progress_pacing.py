"""How often an SL records its ML program's progress on the ledger (``contract.progress``): the first
sync, the first of each epoch, then at most one per interval; the last one left out when training ends."""

from __future__ import annotations

import pytest

from daemons.sl.session import ProgressPacing, progress_interval


def test_syncs_report_at_the_start_of_each_epoch_and_then_once_per_interval() -> None:
    pacing = ProgressPacing(interval=1.0)
    reported = [
        pacing.due({"epochs_done": epoch, "loss": t}, now=t)
        for t, epoch in ((0.0, 0), (0.2, 0), (0.5, 0), (1.1, 0), (1.2, 1), (1.3, 1), (2.4, 1))
    ]
    assert reported == [True, False, False, True, True, False, True]
    assert pacing.unreported() is None  # the last sync was reported


def test_the_last_sync_left_out_is_kept_for_the_end_and_then_forgotten() -> None:
    pacing = ProgressPacing(interval=1.0)
    assert pacing.due({"epochs_done": 1, "loss": 0.9}, now=0.0)
    assert not pacing.due({"epochs_done": 1, "loss": 0.5}, now=0.3)
    assert not pacing.due({"epochs_done": 1, "loss": 0.4}, now=0.6)
    assert pacing.unreported() == {"epochs_done": 1, "loss": 0.4}
    assert pacing.unreported() is None


def test_an_interval_of_zero_reports_every_sync() -> None:
    pacing = ProgressPacing(interval=0.0)
    assert all(pacing.due({"epochs_done": 0}, now=0.0) for _ in range(5))


@pytest.mark.parametrize(("text", "expected"), [("", 1.0), ("0.25", 0.25), ("-3", 0.0), ("soon", 1.0)])
def test_the_interval_comes_from_the_environment_and_a_bad_value_falls_back(
    monkeypatch: pytest.MonkeyPatch, text: str, expected: float
) -> None:
    monkeypatch.setenv("SWARM_PROGRESS_INTERVAL", text)
    assert progress_interval() == expected


def test_an_epoch_end_report_counts_as_the_last_report_and_drops_an_older_left_out_sync() -> None:
    pacing = ProgressPacing(interval=1.0)
    assert pacing.due({"epochs_done": 0, "loss": 0.9}, now=0.0)
    assert not pacing.due({"epochs_done": 0, "loss": 0.5}, now=0.3)
    pacing.reported({"epochs_done": 1, "loss": 0.4}, now=0.4)  # the epoch's end, with its validation
    assert pacing.unreported() is None
    assert not pacing.due({"epochs_done": 1, "loss": 0.3}, now=0.6)  # same epoch, within the interval
    assert pacing.due({"epochs_done": 1, "loss": 0.2}, now=1.5)

"""Trial commands (ours): the trials of a RUN_TRIALS task, the best one, and their plots."""

from __future__ import annotations

from swci.argtypes import ArgKind
from swci.grammar import args
from swci.pattern import Kw, Opt
from swci.registry import Family, Values, command
from swci.trials import GetBestTrial, ListTrials, PlotTrials

__all__: list[str] = []

_FAMILY = Family.TASKS


@command(
    ("LIST", "TRIALS"),
    family=_FAMILY,
    grammar=(args.task(),),
    summary="List the trials of a RUN_TRIALS task with their results",
    help=(
        "Lists every trial of a RUN_TRIALS task: its parameters, status, attempts, the SWOP and "
        "slot of its last run, and its value of the task's Metric; * marks the best trial."
    ),
    examples=("LIST TRIALS mnist_bagging",),
)
def _list_trials(values: Values) -> ListTrials:
    return ListTrials(values.text("name"))


@command(
    ("GET", "BEST", "TRIAL"),
    family=_FAMILY,
    grammar=(args.task(),),
    summary="Show the best trial of a RUN_TRIALS task",
    help="Shows the completed trial with the best value of the task's Metric (by its Goal).",
    examples=("GET BEST TRIAL mnist_bagging",),
)
def _best_trial(values: Values) -> GetBestTrial:
    return GetBestTrial(values.text("name"))


@command(
    ("PLOT", "TRIALS"),
    family=_FAMILY,
    grammar=(args.task(), Opt(Kw("TO"), args.path(ArgKind.DIRECTORY, "dir", "the directory"))),
    summary="Write box plots of a RUN_TRIALS task's results as PNG files",
    help=(
        "Writes PNG box plots of the trials of a RUN_TRIALS task into a directory (default: the "
        "current one): the Metric per value of each parameter, and, when the trials reported "
        "predicted probabilities of probe samples, the prediction certainty of their models."
    ),
    examples=("PLOT TRIALS mnist_bagging", "PLOT TRIALS mnist_bagging TO plots"),
)
def _plot_trials(values: Values) -> PlotTrials:
    return PlotTrials(values.text("name"), values.opt_text("path"))

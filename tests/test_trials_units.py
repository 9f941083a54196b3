"""The pieces of trials and multi-process sites that need no daemon: search spaces, profiles, torchrun
command lines, trial result files, slots and plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemons.sl.cli import _nproc
from daemons.sl.mlprocess import MLSpec, torchrun_argv
from daemons.swop.trials import read_result, trial_slots
from swarmlearning.trial import report_trial
from swci.trial_plots import write_plots
from taskdefs import TaskDefError, expand_search, parse_swop_profile, parse_task_definition

HEAD = """Name: t
TaskType: RUN_TRIALS
Author: me
Prereq: ROOTTASK
Outcome: t
Body:
  Command: model/p.py
  Entrypoint: python3
  WorkingDir: /tmp/t
  Envvars: null
  PrivateContent: null
  SharedContent: null
  Metric: val_error
  Search:
"""


def _search(*lines: str) -> list[dict[str, object]]:
    task = parse_task_definition(HEAD + "".join(f"    {line}\n" for line in lines))
    return expand_search(task.body.search)  # type: ignore[union-attr]


def test_a_grid_is_every_combination_in_order_with_repeats() -> None:
    trials = _search("Kind: GRID", "Repeats: 2", "Parameters: {A: [1, 2], B: [x, y]}")
    assert trials[:3] == [{"A": 1, "B": "x", "TRIAL_SEED": 0}, {"A": 1, "B": "x", "TRIAL_SEED": 1},
                          {"A": 1, "B": "y", "TRIAL_SEED": 0}]  # fmt: skip
    assert len(trials) == 8


def test_random_and_bagging_draws_are_seeded_and_in_range() -> None:
    lines = ("Kind: RANDOM", "Samples: 20", "Seed: 3", "Parameters: {lr: {Low: 0.001, High: 0.1, Log: true},"
             " n: {Low: 1, High: 4, Integer: true}, k: [3, 5]}")  # fmt: skip
    first, again = _search(*lines), _search(*lines)
    assert first == again and len(first) == 20
    assert all(0.001 <= t["lr"] <= 0.1 and t["n"] in (1, 2, 3, 4) and t["k"] in (3, 5) for t in first)  # type: ignore[operator]
    bags = _search("Kind: BAGGING", "Samples: 3", "Seed: 10", "Parameters: {k: [3]}")
    assert bags == [
        {"BOOTSTRAP_SEED": 10, "k": 3},
        {"BOOTSTRAP_SEED": 11, "k": 3},
        {"BOOTSTRAP_SEED": 12, "k": 3},
    ]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ("Kind: GRID", "Parameters: {lr: {Low: 0.1, High: 1}}"),
            "a GRID search takes lists of values, not ranges",
        ),
        (("Kind: RANDOM", "Parameters: {lr: [1]}"), "a RANDOM search needs Samples"),
        (("Kind: BAGGING", "Samples: 2", "Repeats: 2"), "use Samples, not Repeats"),
        (
            ("Kind: RANDOM", "Samples: 2", "Parameters: {lr: {Low: 0, High: 1, Log: true}}"),
            "a Log range needs Low > 0",
        ),
        (("Kind: GRID", "Parameters: {1x: [1]}"), "Search.Parameters"),
        (("Kind: GRID", "Parameters: {A: [1, 2, 3, 4], B: [1, 2, 3]}", "Repeats: 1000"), "at most 10000"),
        (("Kind: SWEEP",), "Search.Kind"),
    ],
)
def test_a_bad_search_is_refused_with_a_located_reason(lines: tuple[str, ...], message: str) -> None:
    with pytest.raises(TaskDefError) as err:
        _search(*lines)
    assert message in str(err.value)


PROFILE = """groupname: g
taskrunner: t
policyuri: ~
resourcemgr: {mgrtype: DOCKER, accessinfo: {accesstype: FROMENV}}
network: n
apls: {locator: {host: h}}
apisrv: {locator: {host: ~}}
envvars: ~
nodes:
  - slnodedef:
      idx: 0
      identity: []
      slhostname: sl1
      privatedata: ~
      slenvvars: ~
      usrhostname: u1
      usrenvvars: ~
      usrcontaineropts:
        - gpus: "device=0,1"
        - nproc: %s
"""


def test_a_node_asks_for_processes_in_its_profile() -> None:
    assert parse_swop_profile(PROFILE % "gpus").node_defs[0].nproc == "gpus"
    assert parse_swop_profile(PROFILE % "2").node_defs[0].nproc == 2
    with pytest.raises(TaskDefError) as err:
        parse_swop_profile(PROFILE % "0")
    assert "usrcontaineropts[1].nproc: must be a number of processes (1-64) or 'gpus'" in str(err.value)


def test_several_processes_run_under_torchrun() -> None:
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert torchrun_argv(["/env/bin/python3", "-u", "m.py", "-x"], 2, "/py") == [
        "/env/bin/python3",
        *launch,
        "m.py",
        "-x",
    ]
    assert torchrun_argv(["python", "-m", "pkg.train"], 2, "/py") == ["python", *launch, "-m", "pkg.train"]
    assert torchrun_argv(["./train.sh", "a"], 2, "/py") == ["/py", *launch, "--no-python", "./train.sh", "a"]
    one = MLSpec("python3", "m.py", Path())
    assert one.argv() == ["python3", "m.py"]
    four = MLSpec("python3", "m.py", Path(), nproc=4).argv()
    assert four == ["python3", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "m.py"]


def test_nproc_gpus_is_one_process_per_gpu_of_the_node() -> None:
    assert _nproc("gpus", {"CUDA_VISIBLE_DEVICES": "0,3"}) == 2
    assert _nproc("gpus", {"CUDA_VISIBLE_DEVICES": ""}) == 1
    assert _nproc("3", {}) == 3
    with pytest.raises(ValueError, match="must be a number of processes"):
        _nproc("lots", {})


def test_slots_are_the_gpus_or_the_cpu_slots() -> None:
    assert [(s.name, s.env) for s in trial_slots(3, ["0", "1"])] == [
        ("gpu0", {"CUDA_VISIBLE_DEVICES": "0"}), ("gpu1", {"CUDA_VISIBLE_DEVICES": "1"})
    ]  # fmt: skip
    assert [s.name for s in trial_slots(2, [])] == ["cpu0", "cpu1"]


def test_a_trial_reports_through_its_result_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "result.json"
    monkeypatch.setenv("SWARM_TRIAL_RESULT", str(target))
    report_trial({"val_error": 0.25}, probabilities=[[0.5, 0.5]], probes=[[1, 2, 3, 4]])
    assert read_result(target) == {"metrics": {"val_error": 0.25}, "probabilities": [[0.5, 0.5]],
                                   "probes": [[1.0, 2.0, 3.0, 4.0]]}  # fmt: skip
    with pytest.raises(ValueError, match="not a finite number"):
        report_trial({"val_error": float("nan")})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "wrote no result"),
        ("{not json", "is not JSON"),
        ("[1, 2]", "must hold a JSON object"),
        (json.dumps({"metrics": {"e": "high"}}), "'metrics' metric 'e' must be a finite number"),
        (json.dumps({"metrics": {}, "probabilities": [[2.0]]}), "probabilities between 0 and 1"),
    ],
)
def test_a_bad_result_file_is_a_clear_failure(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "result.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_result(path)


def test_plots_are_written_for_grids_and_many_valued_parameters(tmp_path: Path) -> None:
    trials = [
        {"index": i, "status": "COMPLETED", "params": {"lr": 0.01 * (i + 1), "k": 3 + 2 * (i % 2), "SEED": i},
         "metrics": {"err": 1.0 / (i + 1)}, "probabilities": [[0.1, 0.9], [0.6, 0.4]]}
        for i in range(12)
    ]  # fmt: skip
    study = {
        "task": "s",
        "metric": "err",
        "goal": "MINIMIZE",
        "trials": trials,
        "probes": [[0.0] * 16, [1.0] * 3],
    }
    written = write_plots(study, tmp_path / "plots")
    assert [p.name for p in written] == ["s-err-by-parameter.png", "s-prediction-certainty.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)
    assert write_plots({**study, "trials": []}, tmp_path / "none") == []

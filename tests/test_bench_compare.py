"""``bench/compare.py``: two versions of the code measured in turns, each one's daemons its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import ROOT
from bench.compare import Measured, env_for, main, ratio_interval, ratios, run_order, summary, unpack, verdict

GIT_CHECKOUT = (ROOT / ".git").exists()


def _measured(version: str, median: float, cpu_sl: float) -> Measured:
    return Measured(version, median, median + 1.0, {"SLs": cpu_sl, "SN": 3.0}, sync_ms=median / 2)


def test_the_working_tree_is_this_one(tmp_path: Path) -> None:
    assert unpack(".", tmp_path) == ROOT
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not GIT_CHECKOUT, reason="needs the git history of this checkout")
def test_a_revision_is_unpacked_whole(tmp_path: Path) -> None:
    tree = unpack("HEAD", tmp_path)
    assert tree.parent == tmp_path
    for part in ("daemons/sl/rounds.py", "wire/envelope.py", "swarmlearning/client/swarm.py"):
        committed = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"HEAD:{part}"], capture_output=True, check=True
        ).stdout
        assert (tree / part).read_bytes() == committed


@pytest.mark.skipif(not GIT_CHECKOUT, reason="needs the git history of this checkout")
def test_a_process_started_for_a_version_imports_that_version(tmp_path: Path) -> None:
    tree = unpack("HEAD", tmp_path)
    shown = subprocess.run(
        [sys.executable, "-c", "import daemons, swarmlearning, wire; print(daemons.__file__, wire.__file__)"],
        capture_output=True, text=True, env=env_for(tree), cwd=tmp_path, check=True,
    ).stdout.split()  # fmt: skip
    assert shown == [str(tree / "daemons" / "__init__.py"), str(tree / "wire" / "__init__.py")]


def test_a_directory_holding_a_tree_is_that_tree(tmp_path: Path) -> None:
    # a GPU machine gets no git history: the base is a tree unpacked beforehand (bench/device/prepare.sh)
    tree = tmp_path / "base"
    for part in ("daemons/sl/rounds.py", "bench/rounds.py"):
        (tree / part).parent.mkdir(parents=True, exist_ok=True)
        (tree / part).write_text("")
    assert unpack(str(tree), tmp_path) == tree.resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]  # nothing unpacked


@pytest.mark.skipif(not GIT_CHECKOUT, reason="needs the git history of this checkout")
def test_an_unknown_revision_stops_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="cannot unpack 'no-such-revision-here'"):
        unpack("no-such-revision-here", tmp_path)


def test_the_summary_gives_both_means_their_ratio_and_the_pairs_spread() -> None:
    pairs = [
        (_measured("HEAD~1", 10.0, 12.0), _measured(".", 9.0, 11.0)),
        (_measured("HEAD~1", 12.0, 13.0), _measured(".", 12.0, 12.0)),
    ]
    assert ratios(pairs, "median_ms") == [0.9, 1.0]
    lines = summary(pairs)
    assert lines[0] == (
        "    median round: base  11.00 ms, new  10.50 ms, new / base 0.955 "
        f"(pairs 0.900-1.000; {verdict([0.9, 1.0])})"
    )
    assert lines[2].startswith("median sync call: base   5.50 ms, new   5.25 ms, new / base 0.955")
    assert lines[3].startswith("     CPU a round: base  15.50 ms, new  14.50 ms, new / base 0.935")
    assert f"         CPU SLs: base  12.50 ms, new  11.50 ms ({verdict([11 / 12, 12 / 13])})" in lines
    assert "          CPU SN: base   3.00 ms, new   3.00 ms (95 % interval 1.000-1.000: not shown)" in lines
    unsampled = (_measured("HEAD~1", 20.0, 30.0), Measured(".", 20.0, 21.0, {}))  # a run too short for it
    assert summary([*pairs, unsampled])[3] == lines[3]  # the CPU of the pairs that have it on both sides
    assert summary([*pairs, unsampled])[4:] == lines[4:]  # and each kind's means leave that pair out
    assert summary([*pairs, unsampled])[2] == lines[2]  # a sync call measured on one side only: left out


def test_a_kind_of_process_no_pair_sampled_on_both_sides_says_so() -> None:
    pairs = [(Measured("HEAD~1", 10.0, 11.0, {"SN": 3.0}), Measured(".", 9.0, 10.0, {}))]
    assert "          CPU SN: not sampled (the run was too short)" in summary(pairs)


def test_a_difference_is_shown_only_when_its_interval_leaves_out_one() -> None:
    # pairs of the 2-core machine of 2026-12-02, one change: scattered on both sides of 1
    scattered = [1.021, 0.96, 0.869, 1.009, 1.098, 0.976]
    low, high = ratio_interval(scattered) or (0.0, 0.0)
    assert low < 1.0 < high
    assert verdict(scattered) == f"95 % interval {low:.3f}-{high:.3f}: not shown"
    assert verdict([0.93, 0.95, 0.94, 0.96]).endswith(": shown")
    assert verdict([1.08, 1.06, 1.07]).endswith(": shown")  # slower is shown as well
    # all on one side is not enough when they scatter: 4 pairs below 1, but far apart
    assert verdict([0.78, 0.99, 0.85, 0.98]).endswith(": not shown")
    assert ratio_interval([0.9]) is None
    assert verdict([0.9]) == "one pair: no interval"


def test_the_interval_weighs_faster_and_slower_alike() -> None:
    low, high = ratio_interval([0.9, 1 / 0.9]) or (0.0, 0.0)
    assert abs(low * high - 1.0) < 1e-12  # centred on 1 on the ratio's log scale


def test_the_side_that_runs_first_changes_every_pair() -> None:
    assert [run_order(pair) for pair in range(4)] == [
        ("base", "new"), ("new", "base"), ("base", "new"), ("new", "base")
    ]  # fmt: skip


def test_a_nonsense_size_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["HEAD", "--mb", "0"])
    assert stopped.value.code == 2
    assert "--mb must be above 0" in capsys.readouterr().err


@pytest.mark.skipif(not GIT_CHECKOUT, reason="needs the git history of this checkout")
def test_one_pair_runs_both_versions(capsys: pytest.CaptureFixture[str]) -> None:
    main(["HEAD", ".", "--pairs", "1", "--rounds", "4", "--mb", "0.01"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "1 pair of 4 rounds, 0.01 MB, 0 s of training"
    assert out[1].strip().startswith("HEAD  round")
    assert out[2].strip().startswith(".  round")
    assert out[3].strip().startswith("median round: base")
    assert out[-1] == "     CPU a round: not sampled (the run was too short)"  # 4 rounds are too few

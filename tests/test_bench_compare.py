"""``bench/compare.py``: two versions of the code measured in turns, each one's daemons its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import ROOT
from bench.compare import Measured, env_for, main, ratios, run_order, summary, unpack

GIT_CHECKOUT = (ROOT / ".git").exists()


def _measured(version: str, median: float, cpu_sl: float) -> Measured:
    return Measured(version, median, median + 1.0, {"SLs": cpu_sl, "SN": 3.0})


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
    assert lines[0] == "    median round: base  11.00 ms, new  10.50 ms, new / base 0.955 (pairs 0.900-1.000)"
    assert lines[2].startswith("     CPU a round: base  15.50 ms, new  14.50 ms, new / base 0.935")
    assert "         CPU SLs: base  12.50 ms, new  11.50 ms" in lines
    unsampled = (_measured("HEAD~1", 20.0, 30.0), Measured(".", 20.0, 21.0, {}))  # a run too short for it
    assert summary([*pairs, unsampled])[2] == lines[2]  # the CPU of the pairs that have it on both sides


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

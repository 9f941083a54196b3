"""Every benchmark script's command line: ``--help`` says what it measures and starts nothing; a wrong
argument stops it with a usage line naming what is wrong (before, most ignored both and ran in full,
some for minutes, and the ones taking numbers died of a traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = (
    "bus", "chain", "compare", "failover", "faults", "faults_nodes", "flower_compare", "fuzz", "ledger",
    "ledger_core", "merge", "robust", "rounds", "run_all", "scale", "secagg", "summation_order", "swarm",
)  # fmt: skip


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(BENCH / f"{script}.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_every_script_that_runs_a_benchmark_is_listed() -> None:
    scripts = {path.stem for path in BENCH.glob("*.py") if 'if __name__ == "__main__":' in path.read_text()}
    programs = {"mlp_pyt", "standin_ml"}  # the ML programs the benchmarks run, not benchmarks
    assert scripts - programs == set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_says_what_it_measures_and_runs_nothing(script: str) -> None:
    done = _run(script, "--help")
    assert done.returncode == 0, done.stderr
    usage, _, rest = done.stdout.partition("\n\n")
    assert usage.startswith(f"usage: {script}.py [-h]")
    assert rest.split("\n\n")[0].strip(), "no description"
    assert done.stderr == ""


@pytest.mark.parametrize(
    ("script", "args", "error"),
    [
        ("rounds", ["--quick"], "unrecognized arguments: --quick"),
        ("swarm", ["--fast"], "unrecognized arguments: --fast"),
        ("swarm", ["--per-node", "5"], "--per-node and --epochs go together"),
        ("swarm", ["--per-node", "5", "--epochs", "0"], "argument --epochs: 0 is not above 0"),
        (
            "swarm",
            ["--no-fork-server"],
            "--sync-frequency, --mode, --model and --no-fork-server go with --per-node/--epochs",
        ),
        ("fuzz", ["lots"], "argument cases: 'lots' is not a whole number"),
        ("compare", ["HEAD", "--pairs", "0"], "argument --pairs: 0 is not above 0"),
        ("chain", ["--rounds", "4"], "--mb must be above 0, --work-s not below 0 and --rounds above 4"),
        ("ledger", ["0"], "argument transactions: 0 is not above 0"),
        ("ledger_core", ["1000", "-5"], "argument batch: -5 is not above 0"),
        ("flower_compare", ["5", "1", "2"], "unrecognized arguments: 2"),
        ("summation_order", ["0"], "argument rounds: 0 is not above 0"),
        ("faults_nodes", ["nope"], "no row nope; the rows are swop_kill, hung_ml, partition, cert_expiry"),
        ("run_all", ["rounds", "nope"], "no benchmark nope; the benchmarks are bus, merge"),
    ],
)
def test_a_wrong_argument_is_one_usage_error(script: str, args: list[str], error: str) -> None:
    done = _run(script, *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert f"{script}.py: error: {error}" in done.stderr
    assert "Traceback" not in done.stderr

"""``make bench``: run every benchmark and write one table to ``bench/results/latest.{md,json}``.

Every row is a ratio against a baseline measured in the same run (``ratio = value / baseline_value``)
with the absolute figures beside it. A benchmark that fails leaves a row saying so, and the others
still run. Run: ``.venv/bin/python bench/run_all.py [name ...]`` (names: see ``BENCHMARKS``).
"""

from __future__ import annotations

import importlib
import json
import math
import operator
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, ROW_KEYS, chosen_names, machine, print_rows

__all__ = ["BENCHMARKS", "main", "met", "render_markdown", "run_benchmarks"]

RESULTS = ROOT / "bench" / "results"
# (name, module): in the order they run; every module has run() -> list[dict] of ROW_KEYS rows.
BENCHMARKS: tuple[tuple[str, str], ...] = (
    ("bus", "bench.bus"),
    ("merge", "bench.merge"),
    ("secagg", "bench.secagg"),
    ("robust", "bench.robust"),
    ("ledger", "bench.ledger"),
    ("rounds", "bench.rounds"),
    ("swarm", "bench.swarm"),
    ("flower", "bench.flower_compare"),
    ("order", "bench.summation_order"),
    ("scale", "bench.scale"),
    ("fuzz", "bench.fuzz"),
    ("failover", "bench.failover"),
    ("faults", "bench.faults"),
)
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_TARGET = re.compile(r"^(ratio|value)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)$")


def met(row: dict[str, Any]) -> str:
    """``yes``/``no`` for a row whose target reads ``ratio|value OP number``; empty without a target."""
    match = _TARGET.match(str(row.get("target") or "").strip())
    if match is None:
        return ""
    subject, op, bound = match.groups()
    actual = row.get(subject)
    if not isinstance(actual, int | float) or math.isnan(actual):
        return "no"
    return "yes" if _OPS[op](float(actual), float(bound)) else "no"


def _failure_row(name: str, exc: BaseException) -> dict[str, Any]:
    message = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
    return {
        "benchmark": f"{name}: FAILED",
        "value": float("nan"),
        "unit": "",
        "baseline": "",
        "baseline_value": float("nan"),
        "ratio": float("nan"),
        "target": "",
        "note": message,
    }


def run_one(name: str, module: str) -> tuple[list[dict[str, Any]], float, str | None]:
    """Rows of one benchmark, its wall time, and its error (a failure row then stands for it)."""
    print(f"[bench] {name} ...", flush=True)
    start = time.perf_counter()
    try:
        rows = list(importlib.import_module(module).run())
        error = None
    except Exception as exc:
        traceback.print_exc()
        rows, error = [_failure_row(name, exc)], f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    for row in rows:
        row["group"] = name
        row["met"] = met(row)
    print(f"[bench] {name}: {len(rows)} rows in {seconds:.1f} s", flush=True)
    return rows, seconds, error


def run_benchmarks(names: Sequence[str] = ()) -> dict[str, Any]:
    """Run the benchmarks (all, or those named) and collect the report."""
    chosen = [(n, m) for n, m in BENCHMARKS if not names or n in names]
    started, start = time.time(), time.perf_counter()
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    timing: dict[str, dict[str, Any]] = {}
    for name, module in chosen:
        got, seconds, error = run_one(name, module)
        rows += got
        timing[name] = {"seconds": round(seconds, 1), "error": error}
    return {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
        "wall_s": round(time.perf_counter() - start, 1),
        "machine": {**machine(), "load_avg_before": load_before, "load_avg_after": os.getloadavg()},
        "benchmarks": timing,
        "rows": rows,
    }


def _cell(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1000:
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value).replace("|", "/")


def render_markdown(report: dict[str, Any]) -> str:
    """The report as markdown: the machine, the table, the time each benchmark took."""
    m = report["machine"]
    load = ", ".join(f"{x:.1f}" for x in m["load_avg_before"])
    lines = [
        f"Measured {report['started']} by `make bench` in {report['wall_s']:.0f} s on {m['cores']} cores "
        f"({m['cpu']}), {m['memory_gib']} GiB, {m['device']}; Python {m['python']}, torch "
        f"{m.get('torch', '-')}, numpy {m['numpy']}, {m.get('mosquitto', 'mosquitto ?')}, "
        f"{m.get('flwr', 'flwr not installed')}; {m['platform']}; load average before: {load}.",
        "",
        "ratio = value / baseline value; every baseline was measured in the same run "
        "(except the reference system's documented 16 SL per SN).",
        "",
        "| benchmark | value | unit | baseline | baseline value | ratio | target | met | note |",
        "|---|---:|---|---|---:|---:|---|---|---|",
    ]
    for row in report["rows"]:
        cells = [row.get(k, "") for k in (*ROW_KEYS[:7], "met", "note")]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    times = ", ".join(
        f"{name} {t['seconds']:.0f} s" + (" (failed)" if t["error"] else "")
        for name, t in report["benchmarks"].items()
    )
    lines += ["", f"Time per benchmark: {times}."]
    return "\n".join(lines) + "\n"


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def write(report: dict[str, Any], folder: Path = RESULTS) -> tuple[Path, Path]:
    """Write ``latest.md`` and ``latest.json`` (each through a ``.tmp`` file, then renamed)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in (
        ("latest.md", render_markdown(report)),
        ("latest.json", json.dumps(_json_safe(report), indent=2) + "\n"),
    ):
        tmp = folder / f"{name}.tmp"
        tmp.write_text(text)
        tmp.replace(folder / name)
        out.append(folder / name)
    return out[0], out[1]


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print the table, write the files; exit status 1 when a benchmark failed."""
    names = chosen_names(__doc__, "benchmark", [n for n, _ in BENCHMARKS], argv)
    report = run_benchmarks(names)
    print_rows(f"open Swarm Learning benchmarks ({report['wall_s']:.0f} s)", report["rows"])
    md, js = write(report)
    print(f"\nwrote {md.relative_to(ROOT)} and {js.relative_to(ROOT)}")
    return 1 if any(t["error"] for t in report["benchmarks"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())

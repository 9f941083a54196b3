"""Scale: how many SL nodes one SN serves on this machine before the round time doubles.

Torch processes for dozens of nodes would exhaust this machine's cores, so every node is a real
``swarm sl`` running the lightweight stand-in ML program (``standin_ml.py``: a 16 kB numpy model,
SwarmCallbackBase, no torch) that sleeps ``WORK_S`` seconds per round as if training on its own hardware,
then syncs with every other node (minPeers = N). Round time = the median time between consecutive
rounds' completion on the last node. The baseline, measured in the same run, is the round time of a
2-node swarm; N grows until the round time passes twice that (or ``MAX_NODES``). The reference system
documents 16 SL nodes per SN on an 8-CPU server.

Run: ``.venv/bin/python bench/scale.py``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, bench_parser, make_row, print_rows
from bench.rounds import round_latency, swarm_rounds

__all__ = ["measure", "run"]

MODEL_BYTES = 16_000
WORK_S = 1.0
ROUNDS = 8
SIZES = (2, 16, 32, 64, 96, 128)
MAX_NODES = SIZES[-1]
REFERENCE_PER_SN = 16


def round_time(nodes: int) -> tuple[float, str]:
    """Median round time (s) of a swarm of ``nodes`` stand-in nodes on a fresh SN, and its CPU split."""
    ws = ROOT / "bench" / "results" / "scale.tmp"
    swarm = swarm_rounds(ws, nodes, MODEL_BYTES, ROUNDS, work_s=WORK_S, prefix="sc")
    shutil.rmtree(ws, ignore_errors=True)
    return round_latency(swarm.nodes), swarm.cpu_note()


def measure(sizes: tuple[int, ...] = SIZES) -> dict[int, tuple[float, str]]:
    """Round time (and CPU split) by swarm size, stopping after the first size whose round time doubled."""
    found: dict[int, tuple[float, str]] = {}
    for nodes in sizes:
        found[nodes] = round_time(nodes)
        print(f"  scale: {nodes} nodes: round {found[nodes][0]:.3f} s; {found[nodes][1]}", flush=True)
        if found[nodes][0] > 2 * found[sizes[0]][0]:
            break
    return found


def run() -> list[dict[str, Any]]:
    """The largest swarm within twice the 2-node round time, and the round time of every size tried."""
    found = measure()
    base_n = min(found)
    base = found[base_n][0]
    served = max(n for n, (t, _) in found.items() if t <= 2 * base)
    doubled = [n for n, (t, _) in found.items() if t > 2 * base]
    per_node = (found[served][0] - base) / max(served - base_n, 1)
    limit = f"doubled at {doubled[0]}" if doubled else f"not doubled at {max(found)}, the most tried"
    stand_in = f"stand-in ML (numpy, no torch), {MODEL_BYTES // 1000} kB model, {WORK_S:g} s pretend training"
    rows = [
        make_row(
            "SL nodes one SN serves before the round time doubles", served, "nodes",
            f"reference: {REFERENCE_PER_SN} SL per SN on 8 CPUs", REFERENCE_PER_SN,
            target="value >= 32",
            note=(
                f"{limit} (vs {base_n} nodes, same run); +{per_node * 1000:.0f} ms per round per node; "
                f"{stand_in}; all on these {os.cpu_count()} cores"
            ),
        )
    ]  # fmt: skip
    rows += [
        make_row(
            f"round time, {n} SL nodes on one SN", t, "s", f"round time, {base_n} SL nodes", base,
            target="ratio <= 2.0", note=f"median of rounds 2..{ROUNDS}; {cpu}",
        )
        for n, (t, cpu) in found.items()
        if n != base_n
    ]  # fmt: skip
    return rows


def main() -> None:
    """Print the rows."""
    bench_parser(__doc__).parse_args()
    print_rows("scale", run())


if __name__ == "__main__":
    main()

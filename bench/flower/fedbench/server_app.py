"""Flower ServerApp: FedAvg over every node for ``num-rounds`` rounds; the final model is tested centrally.

It writes ``result-file`` (JSON): the time each round's aggregate was ready, the final test accuracy.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedbench import task

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run FedAvg and record its timeline."""
    cfg = context.run_config
    rounds, nodes, example = int(cfg["num-rounds"]), int(cfg["num-nodes"]), str(cfg["example"])
    model = task.make_net(example)
    _, test_ds = task.load_shard(str(cfg["test-data-dir"]), example)
    stamps: dict[int, float] = {}
    accuracy: list[float] = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        stamps[server_round] = time.time()
        if server_round < rounds:
            return None
        model.load_state_dict(arrays.to_torch_state_dict())
        accuracy.append(task.evaluate(model, test_ds, example))
        return MetricRecord({"accuracy": accuracy[-1]})

    strategy = FedAvg(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=nodes,
        min_available_nodes=nodes,
    )
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=rounds,
        evaluate_fn=evaluate_fn,
    )
    result = {"round_done": [stamps[r] for r in sorted(stamps)], "accuracy": accuracy[-1], "end": time.time()}
    out = Path(str(cfg["result-file"]))
    out.with_suffix(".part").write_text(json.dumps(result))
    out.with_suffix(".part").replace(out)  # whole, or not at all, for the benchmark that waits on it

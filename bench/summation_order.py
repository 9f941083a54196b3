"""How far the order of a merge's float32 additions alone moves the Flower comparison's final accuracy.

The job of ``bench/flower_compare.py`` (the example's ``Net``, the same 4 shards, its ``ROUNDS`` rounds of
``LOCAL_EPOCHS`` whole local epochs each from the merged model, batches and a fresh Adam as
``bench/flower/fedbench/task.py`` gives them to both sides, one torch thread), run in this one process
with the merge written out: once with the swarm's mean merge (``daemons.sl.merge.merge_states``, the code
our leaders run), and once for each order in ``ORDERS`` with Flower's (``aggregate_arrayrecords`` of flwr
1.41: every model times its weight, added in float32 in the order the replies arrive). Training is
deterministic, so the runs differ only in the last bits of each merge; the final models are tested on
the same 2,000 digits as there.
Each run takes about 15 s on one core.

Run: ``.venv/bin/python bench/summation_order.py [rounds]``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_parser, make_row, positive_int, print_rows
from bench.flower.fedbench import task  # what both sides of the comparison share
from bench.flower_compare import BATCH_SIZE, EXAMPLE, LOCAL_EPOCHS, NODES, PER_NODE, ROUNDS, write_shards
from daemons.sl.merge import merge_states

__all__ = ["ORDERS", "Spread", "measure", "run"]

PROGRAM = EXAMPLE / "model" / "mnist_pyt.py"  # the example's model program, as the comparison loads it
# Every node first once, and in every place once: a Latin square of the 4 replies' arrival orders.
ORDERS: tuple[tuple[int, ...], ...] = ((0, 1, 2, 3), (1, 0, 3, 2), (2, 3, 0, 1), (3, 2, 1, 0))

State = dict[str, np.ndarray]
Merge = Callable[[Sequence[State]], State]


@dataclass(frozen=True)
class Spread:
    """Final test accuracies: the swarm's merge, and Flower's for every order of ``ORDERS``."""

    swarm: float
    flower: dict[tuple[int, ...], float]

    @property
    def flower_mean(self) -> float:
        """Flower's accuracy averaged over the orders (each as likely as another)."""
        return statistics.fmean(self.flower.values())


def swarm_merge(states: Sequence[State]) -> State:
    """The swarm's mean merge, equal weights (every shard has as many samples)."""
    return merge_states(states, [1.0] * len(states), "mean")


def flower_merge(order: Sequence[int]) -> Merge:
    """FedAvg as flwr 1.41 adds it up: ``value * weight`` in float32, in the replies' ``order``."""

    def merge(states: Sequence[State]) -> State:
        factor = 1.0 / len(states)
        total: State = {}
        for node in order:
            for name, value in states[node].items():
                if name in total:
                    total[name] += value * factor
                else:
                    total[name] = value * factor
        return total

    return merge


def federated_accuracy(shards: Sequence[Path], merge: Merge, rounds: int) -> float:
    """Train ``rounds`` rounds of one local epoch per shard from the merged model; the final accuracy."""
    data = [task.load_shard(str(shard), str(PROGRAM)) for shard in shards]
    model = task.make_net(str(PROGRAM))
    merged = {name: value.detach().clone() for name, value in model.state_dict().items()}
    for rnd in range(1, rounds + 1):
        trained = []
        for partition, (train, _) in enumerate(data):
            model.load_state_dict(merged)
            steps = task.round_steps(train, local_epochs=LOCAL_EPOCHS, batch_size=BATCH_SIZE)
            for _ in task.train_round(
                model, train, partition=partition, rnd=rnd, steps=steps, batch_size=BATCH_SIZE
            ):
                pass
            trained.append({name: v.detach().numpy().copy() for name, v in model.state_dict().items()})
        merged = {name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in merge(trained).items()}
    model.load_state_dict(merged)
    return float(task.evaluate(model, data[0][1], str(PROGRAM)))


def measure(shards: Sequence[Path], rounds: int = ROUNDS) -> Spread:
    """The job once with the swarm's merge and once per order of Flower's."""
    swarm = federated_accuracy(shards, swarm_merge, rounds)
    flower = {order: federated_accuracy(shards, flower_merge(order), rounds) for order in ORDERS}
    return Spread(swarm, flower)


def spread_row(spread: Spread, job: str) -> dict[str, object]:
    """The spread as a table row: the swarm's merge against Flower's, averaged over the orders."""
    each = ", ".join(f"{''.join(map(str, o))}: {a:.4f}" for o, a in spread.flower.items())
    return make_row(
        f"vs Flower: final accuracy, the merge's order of float32 additions alone ({job}, in one process)",
        spread.swarm, "acc", f"Flower's FedAvg, mean of {len(spread.flower)} orders of its replies",
        spread.flower_mean,
        note=(
            f"Flower's by the order its replies arrive in (node indices) {each}; ours {spread.swarm:.4f} "
            "whatever order the rows arrive in (a leader adds them in the order of the participants' names); "
            "same batches, start and Adam as both sides of the comparison, so only the merges' rounding "
            "differs"
        ),
    )  # fmt: skip


def run(rounds: int = ROUNDS) -> list[dict[str, object]]:
    """Write the comparison's shards, measure, return the row."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="summation-order-") as ws:
        shards = write_shards(Path(ws))
        spread = measure(shards, rounds)
    epochs = f"{LOCAL_EPOCHS} epoch{'s' if LOCAL_EPOCHS > 1 else ''}"
    job = f"{NODES} nodes x {PER_NODE} digits, {rounds} rounds x {epochs}"
    return [spread_row(spread, job)]


def main() -> None:
    """Print the row."""
    parser = bench_parser(__doc__)
    parser.add_argument(
        "rounds", nargs="?", type=positive_int, default=ROUNDS, help="merges (default %(default)s)"
    )
    print_rows("merge order and accuracy", run(parser.parse_args().rounds))


if __name__ == "__main__":
    main()

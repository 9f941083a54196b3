"""The bagging study of the MNIST CNN (seed 004 at a small size) on this machine, end to end.

It copies the example into a workspace (replacing ``<CURRENT-PATH>``), writes each host's
``mnist.npz`` from scikit-learn's bundled digits (``--mnist PATH`` uses a real Keras ``mnist.npz``),
starts an SN and two SWOPs (two "hosts"; one trial per GPU, or ``--cpu-slots`` per host without GPUs),
and runs the example's ``swci-init``: the ``RUN_TRIALS`` task ``mnist_bagging`` (bootstrap samples, each
with a random draw of ``n_conv_layer``, ``kernel_size``, ``n_hidden_layer``, ``lr`` and ``momentum``),
then ``LIST TRIALS``, ``GET BEST TRIAL`` and ``PLOT TRIALS``: a box plot of the validation error per
parameter value and one of the prediction certainty of the bagged ensemble on four test images.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
HOSTS = 2


def _demo_helpers() -> Any:
    """The data and process helpers of the mnist-pyt demo (one copy of them)."""
    path = ROOT / "examples" / "mnist-pyt" / "run_demo.py"
    spec = importlib.util.spec_from_file_location("mnist_pyt_demo", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo = _demo_helpers()


def prepare(ws: Path, port: int, data: dict[str, np.ndarray], samples: int, epochs: int) -> Path:
    """The example in ``ws`` with its placeholders, port, study size and data in place."""
    if ws.exists():
        shutil.rmtree(ws)
    example = ws / "mnist-bagging"
    for part in ("model", "swci", "swop"):
        shutil.copytree(HERE / part, example / part)
    for path in [*example.glob("swci/**/*"), *example.glob("swop/*")]:
        if path.is_file():
            text = path.read_text().replace("<CURRENT-PATH>", str(example)).replace("30304", str(port))
            text = text.replace("Samples: 8", f"Samples: {samples}")
            text = text.replace('"EPOCHS": 2', f'"EPOCHS": {epochs}')
            path.write_text(text)
    for i in range(1, HOSTS + 1):  # every host holds the data; each trial draws its own bootstrap sample
        (example / f"host{i}" / "data").mkdir(parents=True)
        np.savez(example / f"host{i}" / "data" / "mnist.npz", **data)
    return example


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workspace", type=Path, default=ROOT / "runs" / "mnist-bagging")
    parser.add_argument("--mnist", type=Path, help="a Keras-format mnist.npz instead of the bundled digits")
    parser.add_argument("--samples", type=int, default=8, help="bootstrap samples (trials), default 8")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per trial, default 2")
    parser.add_argument("--cpu-slots", type=int, default=1, help="trials at once per host without GPUs")
    parser.add_argument("--port", type=int, default=0, help="SN port (default: any free port)")
    args = parser.parse_args()
    t0 = time.time()
    port = args.port or demo.free_port()
    data = demo.load_mnist(args.mnist) if args.mnist else demo.digits_as_mnist()
    ws = args.workspace.resolve()
    example = prepare(ws, port, data, args.samples, args.epochs)
    print(f"workspace {ws}: {args.samples} trials over {HOSTS} hosts, {len(data['x_train'])} training images")
    swarm = str(Path(sys.executable).parent / "swarm")
    logs = ws / "logs"
    sn = [swarm, "sn", "--sentinel", "--data-dir", str(ws / "sn"), "--sn-api-port", str(port)]
    procs = [demo.start(sn, logs / "sn.log")]
    try:
        demo.wait_for_line(logs / "sn.log", "Starting SWARM-API-SERVER", procs[0])
        for i in range(1, HOSTS + 1):
            argv = [swarm, "swop", "--profile", str(example / "swop" / f"swop{i}_profile.yaml"),
                    "--uid", f"swop-{i}", "--work-dir", str(ws / f"swop{i}-work"),
                    "--cpu-slots", str(args.cpu_slots)]  # fmt: skip
            procs.append(demo.start(argv, logs / f"swop{i}.log"))
        for i in range(1, HOSTS + 1):
            demo.wait_for_line(logs / f"swop{i}.log", "listening on taskrunner", procs[i])
        print(f"SN and {HOSTS} SWOPs ready ({time.time() - t0:.1f} s); running swci-init")
        swci = [str(Path(sys.executable).parent / "swci"), "--usr-dir", str(example / "swci"),
                "--init-script-name", "swci-init"]  # fmt: skip
        code = subprocess.run(swci, check=False, env={**os.environ, "COLUMNS": "140"}).returncode
    finally:
        for proc in reversed(procs):
            demo.stop(proc)
    print(f"{time.time() - t0:.1f} s in all; plots in {example / 'plots'}; logs in {logs}")
    return code


if __name__ == "__main__":
    sys.exit(main())

"""Prepare the mnist-pyt example in a workspace: its files with the paths filled in, and the data shards.

    python examples/mnist-pyt/prepare.py --workspace runs/mnist [--certs runs/certs] [--port 30304]

Copies the example's ``model``, ``swci`` and ``swop`` folders into the workspace, replacing
``<CURRENT-PATH>`` with the workspace and 30304 with ``--port``, and writes one private ``mnist.npz``
shard per node (Keras format) in ``user1..user4/data-and-scratch/app-data``, made from scikit-learn's
bundled 8x8 digits scaled to 28x28 (nothing is downloaded; ``--mnist FILE`` shards a real mnist.npz).

With ``--certs DIR`` (what ``swarm certs init --dir DIR`` made) the workspace's ``swop/swop_profile.yaml``
is the example's profile with identities: node ``sl-N`` gets ``DIR/sl-N-{cert,key}.pem`` and the CA
``DIR/ca/capath``. Without it, the profile has none (a swarm without certificates).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

EXAMPLE = Path(__file__).resolve().parent
NODES = 4
DEFAULT_PORT = 30304


def digits_as_mnist(seed: int = 0) -> dict[str, np.ndarray]:
    """scikit-learn's digits (1797 8x8 images, 0..16) as 28x28 uint8 MNIST arrays, 80/20 split."""
    digits = load_digits()
    big = np.kron(digits.images, np.ones((3, 3)))  # 24x24
    images = np.clip(np.pad(big, ((0, 0), (2, 2), (2, 2))) * 255.0 / 16.0, 0, 255).astype(np.uint8)
    order = np.random.default_rng(seed).permutation(len(images))
    n_test = len(order) // 5
    test, train = order[:n_test], order[n_test:]
    labels = digits.target.astype(np.uint8)
    return {
        "x_train": images[train],
        "y_train": labels[train],
        "x_test": images[test],
        "y_test": labels[test],
    }


def load_mnist(path: Path) -> dict[str, np.ndarray]:
    """A user's Keras-format mnist.npz."""
    with np.load(path) as data:
        return {k: data[k] for k in ("x_train", "y_train", "x_test", "y_test")}


def write_shards(data: dict[str, np.ndarray], users: list[Path]) -> None:
    """One private training shard per node; every node tests on the whole test set."""
    shards = np.array_split(np.arange(len(data["x_train"])), len(users))
    for user, idx in zip(users, shards, strict=True):
        app_data = user / "data-and-scratch" / "app-data"
        app_data.mkdir(parents=True, exist_ok=True)
        (user / "data-and-scratch" / "scratch").mkdir(parents=True, exist_ok=True)
        np.savez(
            app_data / "mnist.npz",
            x_train=data["x_train"][idx], y_train=data["y_train"][idx],
            x_test=data["x_test"], y_test=data["y_test"],
        )  # fmt: skip


def prepare(
    ws: Path, *, port: int = DEFAULT_PORT, certs: Path | None = None, mnist: Path | None = None
) -> Path:
    """Fill ``ws`` (replacing what was there) and return it; see the module's docstring."""
    ws = ws.resolve()
    if ws.exists():
        shutil.rmtree(ws)
    for part in ("model", "swci", "swop"):
        shutil.copytree(EXAMPLE / part, ws / part)
    profiles = ws / "swop"
    chosen = profiles / ("swop_profile_certs.yaml" if certs else "swop_profile.yaml")
    chosen.replace(profiles / "swop_profile.yaml")
    (profiles / "swop_profile_certs.yaml").unlink(missing_ok=True)
    replacements = {"<CURRENT-PATH>": str(ws), str(DEFAULT_PORT): str(port)}
    if certs is not None:
        replacements["<PROJECT-CERTS>"] = str(certs.resolve())
        replacements["<PROJECT-CACERTS>"] = str((certs / "ca" / "capath").resolve())
    for path in [*ws.glob("swci/**/*"), *profiles.glob("*")]:
        if path.is_file():
            text = path.read_text()
            for old, new in replacements.items():
                text = text.replace(old, new)
            path.write_text(text)
    data = load_mnist(mnist) if mnist else digits_as_mnist()
    write_shards(data, [ws / f"user{i}" for i in range(1, NODES + 1)])
    return ws


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workspace", type=Path, required=True, help="where the example goes (replaced)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"the SN's port (default {DEFAULT_PORT})"
    )
    parser.add_argument("--certs", type=Path, help="the directory `swarm certs init --dir` filled")
    parser.add_argument("--mnist", type=Path, help="a Keras-format mnist.npz to shard instead of the digits")
    args = parser.parse_args()
    if args.certs is not None and not (args.certs / "ca" / "capath").is_dir():
        parser.error(f"--certs {args.certs}: no CA there; run `swarm certs init --dir {args.certs}` first")
    ws = prepare(args.workspace, port=args.port, certs=args.certs, mnist=args.mnist)
    how = "with the identities in " + str(args.certs) if args.certs else "without certificates"
    print(f"prepared {ws}: 4 private data shards, profile {ws / 'swop' / 'swop_profile.yaml'} ({how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

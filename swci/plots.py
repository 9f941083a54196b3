"""``PLOT CONTRACT``: PNG training curves from a contract's history (matplotlib, no display needed).

One overview (``<contract>.png``): loss and metric of every node over time, and of the merged model
(the mean over the nodes of what each reported after loading it), with a tick per merged round. And
one file per node (``<contract>-<node>.png``) with its own curves and the rounds it merged in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib as mpl

mpl.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

__all__ = ["merged_curve", "write_curves"]

View = Mapping[str, Any]
Curve = tuple[list[float], list[float]]
_METRICS = ("loss", "metric")


def _value(record: View, key: str) -> float | None:
    value = record.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _curves(records: Sequence[View], t0: float) -> dict[str, dict[str, Curve]]:
    """node -> metric -> (seconds since t0, values)."""
    curves: dict[str, dict[str, Curve]] = {}
    for r in records:
        if r.get("kind") != "progress":
            continue
        node = curves.setdefault(str(r.get("node")), {m: ([], []) for m in _METRICS})
        for metric in _METRICS:
            value = _value(r, metric)
            if value is not None:
                node[metric][0].append(float(r["time"]) - t0)
                node[metric][1].append(value)
    return curves


def merged_curve(records: Sequence[View], metric: str, t0: float) -> Curve:
    """The merged model's curve: after every report, the mean of each node's latest value."""
    latest: dict[str, float] = {}
    xs: list[float] = []
    ys: list[float] = []
    for r in records:
        value = _value(r, metric)
        if r.get("kind") != "progress" or value is None:
            continue
        latest[str(r.get("node"))] = value
        xs.append(float(r["time"]) - t0)
        ys.append(sum(latest.values()) / len(latest))
    return xs, ys


def _round_ticks(ax: Axes, records: Sequence[View], t0: float, node: str | None) -> None:
    for r in records:
        if r.get("kind") == "round" and (node is None or node in (r.get("contributors") or ())):
            ax.axvline(float(r["time"]) - t0, color="0.85", linewidth=0.6, zorder=0)


def _file_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def _figure(title: str) -> tuple[Any, Sequence[Axes]]:
    fig, axes = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, constrained_layout=True)
    fig.suptitle(title)
    axes[0].set_ylabel("loss")
    axes[1].set_ylabel("metric")
    axes[1].set_xlabel("seconds since the first record")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    return fig, axes


def write_curves(records: Sequence[View], out_dir: Path, contract: str) -> list[Path]:
    """Write the overview and one PNG per node into ``out_dir``; returns the files written.

    Raises:
        ValueError: there is no progress record to plot.
        OSError: a file cannot be written.
    """
    progress = [r for r in records if r.get("kind") == "progress"]
    if not progress:
        raise ValueError(f"contract {contract} has no progress reports to plot yet")
    t0 = min(float(r["time"]) for r in records)
    curves = _curves(records, t0)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [_overview(records, curves, out_dir, contract, t0)]
    for node, node_curves in sorted(curves.items()):
        fig, axes = _figure(f"{contract}: node {node}")
        for ax, metric in zip(axes, _METRICS, strict=True):
            ax.plot(*node_curves[metric], marker=".", linewidth=1.2, label=node)
            _round_ticks(ax, records, t0, node)
        path = out_dir / f"{_file_name(contract)}-{_file_name(node)}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _overview(
    records: Sequence[View], curves: dict[str, dict[str, Curve]], out_dir: Path, contract: str, t0: float
) -> Path:
    fig, axes = _figure(f"{contract}: every node and the merged model")
    for ax, metric in zip(axes, _METRICS, strict=True):
        for node, node_curves in sorted(curves.items()):
            ax.plot(*node_curves[metric], linewidth=1.0, alpha=0.7, label=node)
        ax.plot(*merged_curve(records, metric, t0), color="black", linewidth=2.2, label="merged model")
        _round_ticks(ax, records, t0, None)
    axes[0].legend(loc="best", fontsize="small")
    path = out_dir / f"{_file_name(contract)}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

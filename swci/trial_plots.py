"""PNG plots of a study's trials (matplotlib, no display needed).

* the metric per parameter value: one box plot per parameter, a box per value (values of a
  parameter drawn from a range are grouped into quantile bins);
* the prediction certainty of the trials' models (a bagged ensemble) on each probe sample: a box
  per class of the probabilities the models gave it, the ensemble's mean marked, the probe drawn
  beside it when it is a square image.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["certainty_plot", "metric_plot", "write_plots"]

View = Mapping[str, Any]
_MAX_BOXES = 8
_MAX_PROBES = 4


def _figure(panels: int, width: float = 4.2, height: float = 3.6) -> tuple[Any, list[Any]]:
    import matplotlib  # noqa: PLC0415 - heavy; only PLOT TRIALS needs it

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt  # noqa: PLC0415

    cols = min(panels, 3)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[panels:]:
        ax.set_visible(False)
    return fig, flat[:panels]


def _save(fig: Any, path: Path) -> Path:
    from matplotlib import pyplot as plt  # noqa: PLC0415

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _groups(values: Sequence[Any], scores: Sequence[float]) -> list[tuple[str, list[float]]]:
    """Scores grouped by parameter value, in value order; many distinct numbers become bins."""
    distinct = sorted(set(values), key=lambda v: (isinstance(v, str), v))
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in distinct)
    if not numeric or len(distinct) <= _MAX_BOXES:
        return [(_label(v), [s for x, s in zip(values, scores, strict=True) if x == v]) for v in distinct]
    ordered = sorted(values)
    edges = [ordered[min(len(ordered) - 1, len(ordered) * i // 5)] for i in range(5)] + [ordered[-1]]
    out = []
    for low, high in itertools.pairwise(edges):
        last = high == edges[-1]
        picked = [s for x, s in zip(values, scores, strict=True) if low <= x < high or (last and x == high)]
        if picked:
            out.append((f"{_label(low)}-{_label(high)}", picked))
    return out


def _label(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def metric_plot(study: View, path: Path) -> Path | None:
    """Box plots of the metric of the completed trials per value of each parameter that varies (seeds,
    parameters named ``...SEED``, are left out: a box per bootstrap sample says nothing)."""
    metric = str(study["metric"])
    done = [t for t in study["trials"] if t["status"] == "COMPLETED" and metric in t["metrics"]]
    names = [
        n
        for n in dict.fromkeys(k for t in done for k in t["params"])
        if len({str(t["params"].get(n)) for t in done}) > 1
    ]
    if not done or not names:
        return None
    fig, axes = _figure(len(names))
    for ax, name in zip(axes, names, strict=True):
        trials = [t for t in done if name in t["params"]]
        groups = _groups([t["params"][name] for t in trials], [t["metrics"][metric] for t in trials])
        ax.boxplot([scores for _, scores in groups], tick_labels=[label for label, _ in groups])
        for i, (_, scores) in enumerate(groups, start=1):
            ax.plot([i] * len(scores), scores, ".", alpha=0.5, color="tab:blue")
        ax.set_xlabel(name)
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} by {name}")
        ax.tick_params(axis="x", labelrotation=30)
    fig.suptitle(f"{study['task']}: {len(done)} trials ({study['goal'].lower()} {metric})")
    return _save(fig, path)


def certainty_plot(study: View, path: Path) -> Path | None:
    """Per probe sample, a box per class of the probability each trial's model gave it."""
    rows = [
        t["probabilities"] for t in study["trials"] if t["status"] == "COMPLETED" and t.get("probabilities")
    ]
    if not rows:
        return None
    probes = min(_MAX_PROBES, *(len(r) for r in rows))
    if probes == 0:
        return None
    images = study.get("probes") or []
    fig, axes = _figure(probes, width=5.0)
    for i, ax in enumerate(axes):
        per_model = [r[i] for r in rows if len(r[i]) == len(rows[0][i])]
        classes = len(per_model[0])
        by_class = [[p[c] for p in per_model] for c in range(classes)]
        mean = [sum(col) / len(col) for col in by_class]
        guess = max(range(classes), key=lambda c: mean[c])
        ax.boxplot(by_class, tick_labels=[str(c) for c in range(classes)])
        ax.plot(range(1, classes + 1), mean, "D", color="tab:red", markersize=4, label="ensemble mean")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("class")
        ax.set_ylabel("predicted probability")
        ax.set_title(f"probe {i}: the ensemble of {len(per_model)} says {guess} (p={mean[guess]:.2f})")
        ax.legend(loc="upper right", fontsize="small")
        if i < len(images):
            _inset_image(ax, images[i])
    fig.suptitle(f"{study['task']}: prediction certainty of the {len(rows)} models")
    return _save(fig, path)


def _inset_image(ax: Any, pixels: Sequence[float]) -> None:
    side = math.isqrt(len(pixels))
    if side < 4 or side * side != len(pixels):
        return
    inset = ax.inset_axes((0.02, 0.62, 0.34, 0.34))
    inset.imshow([list(pixels[r * side : (r + 1) * side]) for r in range(side)], cmap="gray_r")
    inset.set_xticks([])
    inset.set_yticks([])


def write_plots(study: View, directory: Path) -> list[Path]:
    """Write the plots a study's results allow into ``directory``; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    task = str(study["task"])
    written = [
        metric_plot(study, directory / f"{task}-{study['metric']}-by-parameter.png"),
        certainty_plot(study, directory / f"{task}-prediction-certainty.png"),
    ]
    return [path for path in written if path is not None]

"""A simulated schedule drawn as a Gantt chart: one row per device, one bar per operation, coloured by kind."""
from __future__ import annotations

from common.parallel.pipeline.schedules import KIND_COLORS, KIND_NAMES
from common.parallel.pipeline.simulator import Result


def plot_timeline(result: Result, ax=None, title: str | None = None, label_micro_batches: bool | None = None):
    """A Gantt chart: one row per device, one bar per op, coloured by kind (FB purple, W orange, ...)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from common.core import plots
    plots.use_house_style()
    sched = result.schedule
    if ax is None:
        _, ax = plt.subplots(figsize=(min(14, 4 + result.makespan / 4), 0.45 * sched.pp + 1.4))
    n_ops = sum(len(sp) for sp in result.spans)
    if label_micro_batches is None:
        label_micro_batches = n_ops <= 200 and sched.pp <= 16
    from matplotlib.collections import PolyCollection
    groups = {}  # (kind, reverse) -> list of rectangles
    for dev, spans in enumerate(result.spans):
        for start, end, kind, op in spans:
            reverse = op[0][1] == 1 and kind != "FB"
            groups.setdefault((kind, reverse), []).append(
                [(start, dev - 0.4), (end, dev - 0.4), (end, dev + 0.4), (start, dev + 0.4)])
            if label_micro_batches and end - start >= 0.6:
                text = "/".join(str(it[3]) for it in op)
                ax.text((start + end) / 2, dev, text, ha="center", va="center", fontsize=6)
    for (kind, reverse), rects in groups.items():
        ax.add_collection(PolyCollection(rects, facecolors=KIND_COLORS[kind], alpha=0.55 if reverse else 1.0,
                                         edgecolors="black" if kind == "FB" else "white", linewidths=0.6,
                                         hatch="//" if reverse else None))
    ax.set_ylim(sched.pp - 0.5, -0.5)
    ax.set_yticks(range(sched.pp))
    ax.set_yticklabels([f"dev {d}" for d in range(sched.pp)], fontsize=7)
    ax.set_xlim(0, result.makespan)
    ax.set_xlabel("time")
    ax.grid(False)
    kinds = sorted({k for sp in result.spans for _, _, k, _ in sp}, key=list(KIND_COLORS).index)
    ax.legend(handles=[Patch(color=KIND_COLORS[k], label=KIND_NAMES[k]) for k in kinds], loc="upper center",
              bbox_to_anchor=(0.5, -0.25), ncol=len(kinds), fontsize=8)
    ax.set_title(title or f"{sched.name}: PP={sched.pp}, makespan {result.makespan:g}, bubble/device "
                          f"{result.bubble:g} (max {result.bubble_max:g})")
    return ax

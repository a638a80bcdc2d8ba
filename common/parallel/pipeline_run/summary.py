"""A schedule's run on real ranks beside the simulator: the simulator is fed the measured op times and message
time, and the measured idle time, makespan and live activation bytes are set beside what it predicts."""
from __future__ import annotations

import statistics

from common.parallel import pipeline


def summarize(sched, per_rank: list, comm: float = 0.0) -> dict:
    """Gradient error vs one process, the measured busy/idle/peak activations per rank (activations in units of one
    micro-batch through 1/PP of the model, as the simulator counts), and the simulator run (`sim`) with the
    measured median op times and one-way message time. bubble_ratio: the worst rank's measured idle over the
    simulated one; makespan_ratio: measured step over simulated."""
    makespan = max(r["makespan"] for r in per_rank)
    med = {}
    for k in ("F", "B", "Bi", "W", "FB"):
        vals = [r["op_median"][k] for r in per_rank if k in r["op_median"]]
        if vals:
            med[k] = statistics.mean(vals)
    F = med.get("F", 1e-9)
    B = med.get("B", med.get("Bi", 0) + med.get("W", 0))
    W = med.get("W", B / 2)
    durations = pipeline.Durations(F=F, B=B, W=min(W, 0.99 * B), FB=med.get("FB"), comm=comm)
    sim = pipeline.simulate(sched, durations)
    busy = [r["busy"] for r in per_rank]
    idle = [makespan - b for b in busy]
    return {"schedule": sched.name, "pp": sched.pp, "max_grad_err": max(r["grad_err"] for r in per_rank),
            "max_weight_err": max(r.get("weight_err", 0.0) for r in per_rank),
            "makespan": makespan, "busy": busy, "idle": idle, "recv_wait": [r["recv_wait"] for r in per_rank],
            "peak_activations": [sched.stage_fraction * r["peak_bytes"] / r["stage_bytes"] for r in per_rank],
            "durations": durations, "sim": sim, "spans": [r["spans"] for r in per_rank],
            "bubble_ratio": max(idle) / sim.bubble_max if sim.bubble_max else float("nan"),
            "makespan_ratio": makespan / sim.makespan}


def compare(results: dict):
    """A table (pandas) of measured vs simulated: makespan, idle (max over ranks), peak activations."""
    import pandas as pd
    rows = []
    for name, r in results.items():
        sim = r["sim"]
        rows.append({"schedule": name, "grad max err": r["max_grad_err"],
                     "step ms": 1e3 * r["makespan"], "step ms (sim)": 1e3 * sim.makespan,
                     "idle ms (max rank)": 1e3 * max(r["idle"]), "idle ms (sim)": 1e3 * sim.bubble_max,
                     "idle measured / sim": r["bubble_ratio"],
                     "peak activations": max(r["peak_activations"]),
                     "peak activations (sim)": max(sim.peak_activations)})
    return pd.DataFrame(rows).set_index("schedule")


def ledger_names(pp: int) -> dict:
    """The ledger names of a run at pipeline size `pp`: pp.real.* for 2 ranks, pp.real.pp<N>.* otherwise."""
    prefix = "pp.real" if pp == 2 else f"pp.real.pp{pp}"
    return {"grad_max_err": f"{prefix}.grad_max_err", "bubble_ratio": f"{prefix}.bubble_ratio"}

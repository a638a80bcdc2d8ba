"""The README formulas of DeepSeek's DualPipe (bubble and memory per device) beside the simulator, and where
DualPipe's simulated bubble leaves its formula (`dualpipe_gap_rule`, `dualpipe_formula_sweep`)."""
from __future__ import annotations

from common.parallel.pipeline.schedules import INTERLEAVED, SCHEDULES, Durations, _check_pp, build
from common.parallel.pipeline.simulator import bubble_max_over, run


def bubble_formula(name: str, pp: int, durations: Durations | None = None, virtual_stages: int = 2) -> float:
    """Bubble per device by formula (DeepSeek DualPipe README; GPipe as 1F1B), in the unit of the durations.
    Interleaved 1F1B (Megatron, Narayanan et al. 2021): (pp-1)(F+B)/v with F, B the times of a full (1/pp) stage."""
    d = durations or Durations()
    _check_pp(pp)
    if name == INTERLEAVED:
        return (pp - 1) * (d.F + d.B) / virtual_stages
    if name in ("gpipe", "1f1b"):
        return (pp - 1) * (d.F + d.B)
    if name == "zb1p":
        return (pp - 1) * (d.F + d.B - 2 * d.W)
    if name == "dualpipe":
        if pp % 2:
            raise ValueError(f"pp={pp!r}: DualPipe needs an even pipeline size")
        return (pp // 2 - 1) * (d.fb + d.B - 3 * d.W)
    raise ValueError(f"schedule={name!r} is not a schedule; allowed: {', '.join(SCHEDULES)}")


def memory_formula(name: str, pp: int, micro_batches: int | None = None, virtual_stages: int = 2) -> dict:
    """Parameter (x one stage) and peak activation (x one micro-batch through one stage) memory per device.

    README table: 1F1B and ZB1P 1x / PP, DualPipe 2x / PP+1; GPipe holds every micro-batch: 1x / micro_batches.
    Interleaved 1F1B: 1x / PP + (PP-1)/v (Megatron: 1 + (PP-1)/(PP v) times 1F1B's; at most micro_batches).
    """
    _check_pp(pp)
    if name == INTERLEAVED:
        v = virtual_stages
        if micro_batches is None:
            raise ValueError("interleaved 1F1B's activation memory depends on micro_batches (when m = pp); pass it")
        return {"parameters": 1, "activations": min(2 * (pp - 1) + (v - 1) * pp + 1, micro_batches * v) / v}
    if name == "gpipe":
        if micro_batches is None:
            raise ValueError("GPipe's activation memory depends on micro_batches; pass it")
        return {"parameters": 1, "activations": micro_batches}
    if name in ("1f1b", "zb1p"):
        return {"parameters": 1, "activations": pp}
    if name == "dualpipe":
        return {"parameters": 2, "activations": pp + 1}
    raise ValueError(f"schedule={name!r} is not a schedule; allowed: {', '.join(SCHEDULES)}")


def readme_table(pp_values=(4, 8, 16), micro_batch_values=(20, 64), durations: Durations | None = None,
                 virtual_stages: int | None = None):
    """Simulated vs formula bubble and memory for 1F1B, ZB1P, DualPipe (and GPipe) as a pandas DataFrame; with
    `virtual_stages`, Megatron's interleaved 1F1B too (simulated with 1/v of the chunk times, on the same model)."""
    import pandas as pd
    d = durations or Durations(1, 2, 1, 2.5)
    v = virtual_stages
    names = SCHEDULES + ((INTERLEAVED,) if v else ())
    rows = []
    for pp in pp_values:
        for m in micro_batch_values:
            for name in names:
                if name == "dualpipe" and (pp % 2 or m < 2 * pp or m % 2):
                    continue
                if name == INTERLEAVED:
                    if m % pp:
                        continue
                    r = run(name, pp, m, Durations(d.F / v, d.B / v, d.W / v, d.fb / v, d.comm), v)
                    mem = memory_formula(name, pp, m, v)
                    rows.append({"PP": pp, "micro-batches": m, "schedule": f"interleaved v={v}",
                                 "bubble sim (mean)": r.bubble, "bubble sim (max)": r.bubble_max,
                                 "bubble formula": bubble_formula(name, pp, d, v),
                                 "params sim": max(r.parameters), "params formula": mem["parameters"],
                                 "activations sim": max(r.peak_activations),
                                 "activations formula": mem["activations"], "makespan": r.makespan})
                    continue
                r = run(name, pp, m, d)
                mem = memory_formula(name, pp, m)
                rows.append({"PP": pp, "micro-batches": m, "schedule": name,
                             "bubble sim (mean)": r.bubble, "bubble sim (max)": r.bubble_max,
                             "bubble formula": bubble_formula(name, pp, d),
                             "params sim": max(r.parameters), "params formula": mem["parameters"],
                             "activations sim": max(r.peak_activations), "activations formula": mem["activations"],
                             "makespan": r.makespan})
    return pd.DataFrame(rows)



def dualpipe_gap_rule(F: float, B: float, W: float) -> int:
    """Where DualPipe's simulated worst-rank bubble lands against its README formula, as the sweep of
    `dualpipe_formula_sweep` shows it: +1 above when the input-gradient backward is shorter than the forward
    (B - W < F) or the weight passes are long (3W >= 2B - F, strictly when B - W = F); 0 on the formula when
    B - W = F; -1 below otherwise.
    (A rule read off the simulator, not a theorem: `dualpipe_formula_sweep` counts the points it gets wrong.)"""
    bi, eps = B - W, 1e-9 * max(F, B)
    if abs(bi - F) <= eps:
        return 1 if 3 * W > 2 * B - F + eps else 0
    return 1 if bi < F or 3 * W >= 2 * B - F - eps else -1


def dualpipe_formula_sweep(pp_values=(4, 8, 16), B_values=None, W_values=None, F: float = 1.0,
                           micro_batches_per_pp: int = 4):
    """Simulated minus formula bubble (worst rank) of DualPipe over a grid of B and W (F fixed, F&B = F + B: the gap
    does not depend on F&B), with the sign `dualpipe_gap_rule` predicts; a pandas DataFrame."""
    import pandas as pd
    B_values = B_values if B_values is not None else [F * x / 4 for x in range(2, 17)]
    W_values = W_values if W_values is not None else [F * x / 4 for x in range(1, 16)]
    rows = []
    grid = [(B, W) for B in B_values for W in W_values if W < B]
    for pp in pp_values:  # one schedule per PP, every (B, W) simulated together
        sims = bubble_max_over(build("dualpipe", pp, micro_batches_per_pp * pp), [Durations(F, B, W) for B, W in grid])
        for (B, W), sim in zip(grid, sims):
            gap = sim - bubble_formula("dualpipe", pp, Durations(F, B, W))
            gap = 0.0 if abs(gap) < 1e-9 else gap
            rows.append({"PP": pp, "F": F, "B": B, "W": W, "sim - formula": gap,
                         "sign": (gap > 0) - (gap < 0), "rule": dualpipe_gap_rule(F, B, W)})
    return pd.DataFrame(rows)

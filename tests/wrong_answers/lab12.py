"""Lab 12's named wrong answers: the profiling loop's checkers (12.1-12.8), each with its look-alikes, the classes of
issue 46 (the clip to [0, 1], the schedule read back, totals vs self times, every expert on every token) and the cheats
that call the workbook's own code."""
import functools

import torch
from test_exercises_lab12 import (
    GUARD_WRONG,
    _absolute,
    _allclose,
    _between_ops,
    _corrected,
    _detached,
    _dropped_rows,
    _equivalent,
    _exact,
    _idle,
    _mean_error,
    _modifies_indices,
    _modifies_input,
    _nan_blind,
    _no_shape_check,
    _none_passes,
    _output_only,
    _padded,
    _per_expert,
    _profile_steps,
    _sorted_assumed,
    _token_order_weights,
    _too_loose,
    _top_op,
    _unclipped,
    _unweighted,
    guard,
)

from common.core import traces
from common.exercises import lab12
from common.moe import moe
from common.systems import capstone


# ---------------------------------------------------------------------------------------------- 12.1
def _one_end(events, window, at_start):
    """Each event clipped at one end of the window only, then merged."""
    lo, hi = window
    cut = [{"ts": max(e["ts"], lo), "dur": e["ts"] + e["dur"] - max(e["ts"], lo)} if at_start else
           {"ts": e["ts"], "dur": min(e["ts"] + e["dur"], hi) - e["ts"]} for e in events]
    return _unclipped([c for c in cut if c["dur"] > 0], window)


def _end_moves_back(events, window):
    lo, hi = window
    busy, covered = 0.0, lo
    for s, t in sorted((max(e["ts"], lo), min(e["ts"] + e["dur"], hi)) for e in events):
        s = max(s, covered)
        if t > s:
            busy += t - s
        covered = t  # a nested child's end moves it back
    return 1 - busy / (hi - lo)


def _sorts_in_place(events, window):
    events.sort(key=lambda e: e["ts"])
    return _idle(events, window)


# ---------------------------------------------------------------------------------------------- 12.5, 12.8
def _every_expert(x, weights, indices, w_gate, w_up, w_down, act):
    """Every expert on every token -- three batched products over E x T rows -- then each token's k weighted."""
    e = w_gate.shape[0]
    xs = x.unsqueeze(0).expand(e, -1, -1)
    y = torch.bmm(act(torch.bmm(xs, w_gate), torch.bmm(xs, w_up)), w_down)  # [E, T, H]
    dense = torch.zeros(x.shape[0], e, dtype=x.dtype).scatter_add(1, indices, weights)  # [T, E]
    return torch.einsum("te,eth->th", dense, y)


def _capacity_factor(x, weights, indices, w_gate, w_up, w_down, act):
    """Grouped, each expert's slot sized by a capacity factor of 2 (GShard's) instead of the busiest count."""
    t, k = indices.shape
    e, h = w_gate.shape[0], x.shape[1]
    plan = moe.dispatch_plan(indices, e)
    cap = 2 * -(-t * k // e)
    flat = indices.reshape(-1)[plan.order]
    slot = flat * cap + (torch.arange(t * k) - plan.offsets[flat])
    buf = torch.zeros(e * cap, h, dtype=x.dtype).index_copy(0, slot, moe.dispatch(x, plan)).view(e, cap, h)
    out = torch.bmm(act(torch.bmm(buf, w_gate), torch.bmm(buf, w_up)), w_down).reshape(e * cap, h)[slot]
    return moe.combine(out, plan, weights, t)


def _no_act(x, weights, indices, w_gate, w_up, w_down, act):
    return _padded(x, weights, indices, w_gate, w_up, w_down, lambda g, u: torch.nn.functional.silu(g) * u)


def _capstone_ffn(x, weights, indices, w_gate, w_up, w_down, act):
    plan = moe.dispatch_plan(indices, w_gate.shape[0])
    g, u, d = w_gate.unbind(0), w_up.unbind(0), w_down.unbind(0)
    outs = [capstone.ffn(r, g[e], u[e], d[e], act)
            for e, r in enumerate(moe.dispatch(x, plan).split(plan.counts.tolist()))]
    return moe.combine(torch.cat(outs), plan, weights, indices.shape[0])


def _act_twice(x, weights, indices, w_gate, w_up, w_down, act):
    """One act call per projection pair, plus a probe call: act must run once, on all rows."""
    act(torch.zeros(1, w_gate.shape[2], dtype=x.dtype), torch.zeros(1, w_gate.shape[2], dtype=x.dtype))
    return _padded(x, weights, indices, w_gate, w_up, w_down, act)


def _with_aux(*args):
    return _padded(*args), 0.0


# ---------------------------------------------------------------------------------------------- 12.6
def _folded_wait(step, path, wait, warmup, active, device):
    return _profile_steps(step, path, wait + warmup, 0, active, device)


def _no_warmup(step, path, wait, warmup, active, device):
    return _profile_steps(step, path, wait, 0, active + warmup, device)


def _no_schedule(step, path, wait, warmup, active, device):
    return _profile_steps(step, path, wait, warmup, active, device, schedule=None)


def _no_prof_step(step, path, wait, warmup, active, device):
    from torch.profiler import ProfilerActivity, profile, schedule
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=wait, warmup=warmup, active=active),
                 record_shapes=True, with_stack=True) as prof:
        for _ in range(wait + warmup + active):
            step()
    prof.export_chrome_trace(str(path))
    return prof


def _legacy(step, path, wait, warmup, active, device):
    with torch.autograd.profiler.profile(record_shapes=True, with_stack=True) as prof:
        for _ in range(wait + warmup + active):
            step()
    prof.export_chrome_trace(str(path))
    return prof


def _hard_coded(step, path, wait, warmup, active, device):
    return _profile_steps(step, path, 1, 1, 2, device)


def _cpu_only(step, path, wait, warmup, active, device):
    return _profile_steps(step, path, wait, warmup, active, "cpu")


def _no_trace(step, path, wait, warmup, active, device):
    from torch.profiler import ProfilerActivity, profile, schedule
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=wait, warmup=warmup, active=active),
                 record_shapes=True, with_stack=True) as prof:
        for _ in range(wait + warmup + active):
            step()
            prof.step()
    return prof


# ---------------------------------------------------------------------------------------------- 12.7
def _by(attr, aten=True, pick=max, per_call=False):
    def top(averages, device="cpu"):
        rows = [a for a in averages if a.key.startswith("aten::") or not aten]
        t = pick(rows, key=lambda a: getattr(a, attr) / (a.count if per_call else 1))
        return t.key, t.input_shapes, getattr(t, attr)
    return top


def _self_key(device):
    return "self_device_time_total" if device == "cuda" else "self_cpu_time_total"


def _by_self(pick=max, per_call=False):
    return lambda avgs, device="cpu": _by(_self_key(device), pick=pick, per_call=per_call)(avgs, device)


def _total_on_device(averages, device="cpu"):
    return _by("device_time_total" if device == "cuda" else "self_cpu_time_total")(averages, device)


def _device_always(averages, device="cpu"):
    return _by("self_device_time_total")(averages, device)


def _first_shapes(averages, device="cpu"):
    """The shapes looked up again by name -- and found on the other row of that name (group_by_input_shape keeps
    one row per shape); a lookup by name finds either, so the audit takes the wrong one every time."""
    key = _self_key(device)
    top = max((a for a in averages if a.key.startswith("aten::")), key=lambda a: getattr(a, key))
    other = [a for a in averages if a.key == top.key and a is not top]
    return top.key, (other or [top])[0].input_shapes, getattr(top, key)


WRONG = {
    lab12.check_idle_share: [
        (_between_ops, "edges"),
        (_unclipped, "counted in full; clip each"),
        (_sorted_assumed, "not sorted by start time"),
        (_end_moves_back, "moved your covered-up-to point back"),
        (functools.partial(_one_end, at_start=True), "only at the window's start"),
        (functools.partial(_one_end, at_start=False), "only at the window's end"),
        (lambda e, w: (w[1] - w[0]) * _idle(e, w), "idle TIME in microseconds"),
        (_sorts_in_place, "modified the events list"),
        (lambda e, w: traces.idle_share(e, w), "traces.idle_share, the reference"),
        (lambda e, w: 1 - sum(t - s for s, t in traces.merged_intervals(e, w)) / (w[1] - w[0]),
         "traces.merged_intervals, the reference"),
        (lambda e, w: f"{_idle(e, w):.1%}", "expected a fraction"),
    ],
    lab12.check_equivalent: [
        (_exact, "an exact comparison \\(torch.equal"),
        (_allclose, "an elementwise relative test like allclose"),
        (_absolute, "fixed absolute tolerance"),
        (lambda r, g: _absolute(r, g, atol=1e-2), "cannot see errors in small gradients"),
        (_output_only, "compare every gradient"),
        (_too_loose, "too loose"),
        (_nan_blind, "NaN compares false"),
        (_no_shape_check, "check shapes first"),
        (_none_passes, "None \\(never computed\\)"),
        (_mean_error, "one wrong element"),
        (lambda r, g: capstone.equivalent(r, g), "the reference this exercise asks you to write"),
        (lambda r, g: "yes" if _equivalent(r, g) else "no", "expected True or False"),
        (lambda r, g: _equivalent(r, {k: g[k] for k in r}) if set(g) <= set(r) else False,
         "your check crashed with KeyError"),
    ],
    lab12.check_corrected_share: [
        (lambda p, po, pr, o, u: (p - po * (pr - u) / o) / u, "not clipped"),
        (lambda p, po, pr, o, u: max((p - po * (pr - u) / o) / u, 0.0), "clipped at 0 only"),
        (lambda p, po, pr, o, u: min((p - po * (pr - u) / o) / u, 1.0), "clipped at 1 only"),
        (lambda p, po, pr, o, u: p - po * (pr - u) / o, "corrected TIME in ms"),
        (lambda p, po, pr, o, u: (p - (pr - u)) / u, "the step's whole overhead"),
        (lambda p, po, pr, o, u: p / pr, "raw profile share"),
        (lambda p, po, pr, o, u: p / u, "still the profiled one"),
        (lambda p, po, pr, o, u: (p - po * (pr - u) / o) / pr, "over the PROFILED step"),
        (lambda p, po, pr, o, u: (p - po * pr / o) / u, "only the difference"),
        (lambda *a: 100 * _corrected(*a), "a percentage"),
        (lambda *a: capstone.corrected_share(*a), "corrected_share, the reference this exercise"),
    ],
    lab12.check_keep_or_revert: [(functools.partial(guard, **m), w) for m, w in GUARD_WRONG] + [
        (lambda *a: capstone.keep_or_revert(*a), "the reference this exercise asks you to write"),
        (lambda cur, cand, bar, pairs, mp, rng, clock, sync: (
            "keep" if capstone.decide(guard(cur, cand, bar, pairs, mp, rng, clock, sync)[1], bar) == "keep"
            else "revert", []), "capstone.guard.decide, the workbook's own code"),
    ],
    lab12.check_moe_sorted_forward: [
        (_token_order_weights, "same permutation"),
        (_detached, "backward pass failed|no gradient reached"),
        (_modifies_input, "in-place operation"),
        (lambda *a: capstone.moe_sorted_forward(*a), "capstone's own MoE layer"),
        (_every_expert, "every expert on every token"),
        (_no_act, "`act` was never called"),
        (_capstone_ffn, "called common.systems.capstone.experts.ffn, the workbook's own code"),
        (_with_aux, "expected a tensor"),
    ],
    lab12.check_profile_steps: [
        (_folded_wait, "folded into wait"),
        (_no_warmup, "warmup=0"),
        (_no_schedule, "has no schedule"),
        (_no_prof_step, "prof.step\\(\\) after each"),
        (_legacy, "legacy autograd profiler"),
        (_hard_coded, "ran the step"),
        (_cpu_only, "add ProfilerActivity.CUDA"),
        (_no_trace, "export_chrome_trace"),
        (lambda *a: _profile_steps(*a, record_shapes=False), "record_shapes is off"),
        (lambda *a: _profile_steps(*a, with_stack=False), "with_stack is off"),
        (lambda *a: _profile_steps(*a[:5], "cuda"), "CUDA only on a GPU run"),
        (lambda *a: None, "returned NoneType"),
    ],
    lab12.check_top_op: [
        (_by("cpu_time_total"), "TOTAL time"),
        (_total_on_device, "total device time"),
        (_by("self_cpu_time_total"), "its launch"),
        (_by_self(per_call=True), "PER CALL"),
        (_by_self(pick=min), "SMALLEST self time"),
        (lambda a, d="cpu": _by(_self_key(d), aten=False)(a, d), "Python frame"),
        (_device_always, "self time 0 on a CPU run"),
        (lambda a, d: _top_op(a, d)[:2], "return a tuple"),
        (_first_shapes, "another entry's"),
        (lambda a, d: (*_top_op(a, d)[:2], _top_op(a, d)[2] / 1e3), "in milliseconds"),
    ],
    lab12.check_moe_grouped_forward: [
        (_unweighted, "gate weight"),
        (_per_expert, "makes 3 x E"),
        (_act_twice, "`act` was called 2 times"),
        (_dropped_rows, "rows were dropped"),
        (_capstone_ffn, "capstone.experts.ffn, the workbook's own code"),
        (_detached, "backward pass failed|no gradient reached"),
        (lambda *a: capstone.moe_grouped_forward(*a), "capstone's own MoE layer"),
        (_modifies_indices, "modified its input indices"),
        (_every_expert, "every expert on every token"),
        (_capacity_factor, "busiest expert's count"),
        (_no_act, "`act` was never called"),
        (_with_aux, "expected a tensor"),
    ],
}

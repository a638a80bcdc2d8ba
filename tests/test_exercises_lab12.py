import pytest
import torch
from learner import own_copy

from common.core import traces
from common.core.checks import CheckFailed
from common.exercises import lab12
from common.moe import moe
from common.systems import capstone


@pytest.fixture(autouse=True, scope="module")
def _triton_mode_first():
    """Set Triton's mode before torch.profiler imports triton (as a notebook's set-up cell does)."""
    from common.core.env import current
    current()


def _stub(*a):
    raise NotImplementedError("Exercise 12.x")


# ---------------------------------------------------------------- 12.8 grouped MoE forward
def _padded(x, weights, indices, w_gate, w_up, w_down, act):
    """A learner's right answer, written independently of capstone.moe_grouped_forward: zero-padded bmm."""
    t, k = indices.shape
    e, h = w_gate.shape[0], x.shape[1]
    plan = moe.dispatch_plan(indices, e)
    cap = max(int(plan.counts.max()), 1)
    flat = indices.reshape(-1)[plan.order]
    pos = torch.arange(t * k) - plan.offsets[flat]
    slot = flat * cap + pos
    buf = torch.zeros(e * cap, h, dtype=x.dtype).index_copy(0, slot, moe.dispatch(x, plan)).view(e, cap, h)
    out = torch.bmm(act(torch.bmm(buf, w_gate), torch.bmm(buf, w_up)), w_down).reshape(e * cap, h)[slot]
    return moe.combine(out, plan, weights, t)


def _per_expert(x, weights, indices, w_gate, w_up, w_down, act):
    """Sorted dispatch, act once, but a matmul per expert and weight: not grouped."""
    t = indices.shape[0]
    plan = moe.dispatch_plan(indices, w_gate.shape[0])
    counts = plan.counts.tolist()
    xs = moe.dispatch(x, plan).split(counts)
    h = act(torch.cat([r @ w_gate[e] for e, r in enumerate(xs)]), torch.cat([r @ w_up[e] for e, r in enumerate(xs)]))
    ys = torch.cat([r @ w_down[e] for e, r in enumerate(h.split(counts))])
    return moe.combine(ys, plan, weights, t)


def _act_per_expert(x, weights, indices, w_gate, w_up, w_down, act):
    t = indices.shape[0]
    plan = moe.dispatch_plan(indices, w_gate.shape[0])
    xs = moe.dispatch(x, plan).split(plan.counts.tolist())
    ys = torch.cat([act(r @ w_gate[e], r @ w_up[e]) @ w_down[e] for e, r in enumerate(xs)])
    return moe.combine(ys, plan, weights, t)


def _mask_loop(x, weights, indices, w_gate, w_up, w_down, act):
    """Hugging Face's training branch: right numbers, a loop over experts."""
    t, k = indices.shape
    xs, flat = x.repeat_interleave(k, 0), indices.reshape(-1)
    y = torch.zeros_like(xs)
    for e in range(w_gate.shape[0]):
        m = flat == e
        y[m] = act(xs[m] @ w_gate[e], xs[m] @ w_up[e]) @ w_down[e]
    return (y.view(t, k, -1) * weights.unsqueeze(-1)).sum(1)


def _unweighted(x, weights, indices, *ws):
    return _padded(x, torch.ones_like(weights), indices, *ws)


def _dropped_rows(x, weights, indices, w_gate, w_up, w_down, act):
    """Capacity of the mean count: the busiest experts' overflow rows are dropped."""
    t, k = indices.shape
    e, h = w_gate.shape[0], x.shape[1]
    plan = moe.dispatch_plan(indices, e)
    cap = max(t * k // e, 1)
    flat = indices.reshape(-1)[plan.order]
    pos = torch.arange(t * k) - plan.offsets[flat]
    keep = pos < cap
    slot = (flat * cap + pos)[keep]
    buf = torch.zeros(e * cap, h, dtype=x.dtype).index_copy(0, slot, moe.dispatch(x, plan)[keep]).view(e, cap, h)
    out = torch.zeros(t * k, h, dtype=x.dtype)
    out[keep] = torch.bmm(act(torch.bmm(buf, w_gate), torch.bmm(buf, w_up)), w_down).reshape(e * cap, h)[slot]
    return moe.combine(out, plan, weights, t)


def _detached(*args):
    return _padded(*args).detach()


def _calls_reference(x, weights, indices, w_gate, w_up, w_down, act):
    return capstone.moe_grouped_forward(x, weights, indices, w_gate, w_up, w_down, act)


def _modifies_input(x, weights, indices, *rest):
    weights /= weights.sum(-1, keepdim=True).detach()
    return _padded(x, weights, indices, *rest)


def _modifies_indices(x, weights, indices, *rest):
    indices.copy_(indices.flip(1))  # same answer, but the caller's indices are changed
    return _padded(x, weights.flip(1), indices, *rest)


def test_moe_grouped_forward():
    assert lab12.check_moe_grouped_forward(_padded).passed
    for wrong, match in [(_unweighted, "gate weight"), (_per_expert, "matrix multiplications"),
                         (_act_per_expert, "matrix multiplications|called .* times"),
                         (_mask_loop, "matrix multiplications"), (_dropped_rows, "rows were dropped"),
                         (_detached, "backward|gradient"), (_calls_reference, "write it"),
                         (_modifies_input, "modified its input|in-place"),
                         (_modifies_indices, "modified its input indices")]:
        with pytest.raises(CheckFailed, match=match):
            lab12.check_moe_grouped_forward(wrong)
    assert lab12.check_moe_grouped_forward(_stub).status == "not attempted"


# ---------------------------------------------------------------- 12.5 sorted dispatch
def _sorted(x, weights, indices, w_gate, w_up, w_down, act, split_weights=True):
    """A learner's right answer: sort once, one host read, each expert on its slice, weights split once."""
    t = indices.shape[0]
    plan = moe.dispatch_plan(indices, w_gate.shape[0])
    ws = (w_gate.unbind(0), w_up.unbind(0), w_down.unbind(0)) if split_weights else (w_gate, w_up, w_down)
    outs = [act(r @ ws[0][e], r @ ws[1][e]) @ ws[2][e]
            for e, r in enumerate(moe.dispatch(x, plan).split(plan.counts.tolist()))]
    return moe.combine(torch.cat(outs), plan, weights, t)


def _token_order_weights(x, weights, indices, w_gate, w_up, w_down, act):
    """Rows in expert order, weights in token order."""
    t = indices.shape[0]
    plan = moe.dispatch_plan(indices, w_gate.shape[0])
    g, u, d = w_gate.unbind(0), w_up.unbind(0), w_down.unbind(0)
    out = torch.cat([act(r @ g[e], r @ u[e]) @ d[e]
                     for e, r in enumerate(moe.dispatch(x, plan).split(plan.counts.tolist()))])
    return torch.zeros_like(x).index_add(0, plan.token_index, out * weights.reshape(-1, 1))


def test_moe_sorted_forward():
    assert lab12.check_moe_sorted_forward(_sorted).passed
    assert lab12.check_moe_sorted_forward(_padded).passed  # grouped is sorted too
    for wrong, match in [(_mask_loop, "boolean masks"), (lambda *a: _sorted(*a, split_weights=False), "unbind"),
                         (_unweighted, "gate weight"), (_token_order_weights, "permutation"),
                         (_detached, "backward|gradient"), (_modifies_input, "modified its input|in-place"),
                         (lambda *a: capstone.moe_sorted_forward(*a), "write it")]:
        with pytest.raises(CheckFailed, match=match):
            lab12.check_moe_sorted_forward(wrong)
    assert lab12.check_moe_sorted_forward(_stub).status == "not attempted"


def test_one_act_call_is_required():
    def twice(x, weights, indices, w_gate, w_up, w_down, act):
        act(torch.zeros(1, w_gate.shape[2], dtype=x.dtype), torch.zeros(1, w_gate.shape[2], dtype=x.dtype))
        return _padded(x, weights, indices, w_gate, w_up, w_down, act)
    with pytest.raises(CheckFailed, match="called 2 times"):
        lab12.check_moe_grouped_forward(twice)


# ---------------------------------------------------------------- 12.1 idle share
def _idle(events, window):
    lo, hi = window
    spans = sorted((max(e["ts"], lo), min(e["ts"] + e["dur"], hi)) for e in events)
    busy, end = 0.0, lo
    for s, t in spans:
        s = max(s, end)
        if t > s:
            busy += t - s
            end = t
    return 1 - busy / (hi - lo)


def _summed(events, window):
    lo, hi = window
    return 1 - sum(min(e["ts"] + e["dur"], hi) - max(e["ts"], lo) for e in events
                   if e["ts"] + e["dur"] > lo and e["ts"] < hi) / (hi - lo)


def _between_ops(events, window):
    if not events:
        return 1.0
    first, last = min(e["ts"] for e in events), max(e["ts"] + e["dur"] for e in events)
    return _idle(events, (max(first, window[0]), min(last, window[1])))


def _unclipped(events, window):
    return 1 - sum(t - s for s, t in own_copy(traces.merged_intervals)(events)) / (window[1] - window[0])


def _sorted_assumed(events, window):
    lo, hi = window
    busy, end = 0.0, lo
    for e in events:  # assumes the events are sorted by start time
        s, t = max(e["ts"], end), min(e["ts"] + e["dur"], hi)
        if t > s:
            busy += t - s
            end = t
    return 1 - busy / (hi - lo)


def test_idle_share():
    assert lab12.check_idle_share(_idle).passed
    for wrong, match in [(_summed, "counted twice"), (_between_ops, "edges"), (_unclipped, "counted in full"),
                         (lambda e, w: 1 - _idle(e, w), "BUSY"), (lambda e, w: 100 * _idle(e, w), "percentage"),
                         (_sorted_assumed, "not sorted by start time")]:
        with pytest.raises(CheckFailed, match=match):
            lab12.check_idle_share(wrong)
    assert lab12.check_idle_share(_stub).status == "not attempted"


# ---------------------------------------------------------------- 12.2 equivalence
def _equivalent(ref, got, rtol=1e-4):
    if set(ref) != set(got):
        return False
    for k, r in ref.items():
        g = got[k]
        if g is None or r is None:
            if g is not r:
                return False
            continue
        if g.shape != r.shape or not torch.isfinite(g).all():
            return False
        if (g - r).abs().max() > rtol * r.abs().max():
            return False
    return True


def _exact(ref, got):
    return set(ref) == set(got) and all(got[k] is not None and torch.equal(ref[k], got[k]) for k in ref)


def _absolute(ref, got, atol=1e-3):
    return set(ref) == set(got) and all(got[k] is not None and got[k].shape == ref[k].shape
                                        and torch.isfinite(got[k]).all()
                                        and (got[k] - ref[k]).abs().max() <= atol for k in ref)


def _allclose(ref, got):
    return set(ref) == set(got) and all(got[k] is not None and got[k].shape == ref[k].shape
                                        and torch.allclose(got[k], ref[k]) for k in ref)


def _output_only(ref, got):
    return _equivalent({"out": ref["out"]}, {"out": got["out"]})


def _too_loose(ref, got):
    return _equivalent(ref, got, rtol=0.05)


def _nan_blind(ref, got):
    for k, r in ref.items():
        g = got.get(k)
        if g is None or g.shape != r.shape:
            return False
        if (g - r).abs().max() > 1e-4 * r.abs().max():
            return False
    return True


def _no_shape_check(ref, got):
    for k, r in ref.items():
        g = got.get(k)
        if g is None or not torch.isfinite(g).all():
            return False
        if (g - r).abs().max() > 1e-4 * r.abs().max():
            return False
    return True


def _none_passes(ref, got):
    return all(got.get(k) is None or (got[k].shape == r.shape and torch.isfinite(got[k]).all() and
                                      (got[k] - r).abs().max() <= 1e-4 * r.abs().max()) for k, r in ref.items())


def _aggregate(error):
    """An equivalence check on one aggregate error per tensor (a mean, or a norm) where the largest is asked for."""
    def check(ref, got):
        if set(ref) != set(got):
            return False
        for k, r in ref.items():
            g = got[k]
            if g is None or g.shape != r.shape or not torch.isfinite(g).all() or error(g, r):
                return False
        return True
    return check


_mean_error = _aggregate(lambda g, r: (g - r).abs().mean() > 1e-4 * r.abs().max())
_norm_error = _aggregate(lambda g, r: torch.linalg.norm(g - r) > 1e-3 * torch.linalg.norm(r))


def test_equivalent():
    assert lab12.check_equivalent(_equivalent).passed
    assert lab12.check_equivalent(own_copy(capstone.equivalent)).passed
    for wrong, match in [(_exact, "correct result"), (_allclose, "correct result"), (_absolute, "absolute tolerance"),
                         (lambda r, g: _absolute(r, g, atol=1e-2), "cannot see errors in small gradients"),
                         (_output_only, "every gradient"), (_too_loose, "too loose"), (_nan_blind, "NaN"),
                         (_no_shape_check, "shapes"), (_none_passes, "None"), (_mean_error, "one wrong element"),
                         (_norm_error, "one wrong element")]:
        with pytest.raises(CheckFailed, match=match):
            lab12.check_equivalent(wrong)
    assert lab12.check_equivalent(_stub).status == "not attempted"


# ---------------------------------------------------------------- 12.3 corrected share
def _corrected(part_ms, part_ops, profiled_ms, ops, unprofiled_ms):
    per_op = (profiled_ms - unprofiled_ms) / ops
    return min(max((part_ms - part_ops * per_op) / unprofiled_ms, 0.0), 1.0)


def test_corrected_share():
    assert lab12.check_corrected_share(_corrected).passed
    assert lab12.check_corrected_share(own_copy(capstone.corrected_share)).passed
    for wrong, match in [(lambda p, po, pr, o, u: p / pr, "raw profile share"),
                         (lambda p, po, pr, o, u: p / u, "still the profiled one"),
                         (lambda p, po, pr, o, u: (p - po * (pr - u) / o) / pr, "over the PROFILED step"),
                         (lambda p, po, pr, o, u: (p - po * pr / o) / u, "only the difference"),
                         (lambda *a: 100 * _corrected(*a), "percentage"),
                         (lambda p, po, pr, o, u: (p - o * (pr - u) / o) / u, "corrected_share")]:
        with pytest.raises(CheckFailed, match=match):
            lab12.check_corrected_share(wrong)
    assert lab12.check_corrected_share(_stub).status == "not attempted"


# ---------------------------------------------------------------- 12.6 driving the profiler
def _profile_steps(step, trace_path, wait=1, warmup=1, active=2, device="cpu", **override):
    from torch.profiler import ProfilerActivity, profile, schedule
    opts = dict(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else []),
                schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1), record_shapes=True,
                with_stack=True)
    opts.update(override)
    with profile(**opts) as prof:
        for _ in range(wait + warmup + active):
            step()
            prof.step()
    prof.export_chrome_trace(str(trace_path))
    return prof


def test_profile_steps():
    from torch.profiler import ProfilerActivity
    assert lab12.check_profile_steps(_profile_steps).passed

    # (the schedule's, the trace's and the activities' mistakes: tests/wrong_answers/lab12.py)
    for wrong, match in [(lambda *a: _profile_steps(*a, record_shapes=False), "record_shapes"),
                         (lambda *a: _profile_steps(*a, with_stack=False), "with_stack"),
                         (lambda *a: _profile_steps(*a, activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]),
                          "CUDA only on a GPU run"),
                         (lambda *a: None, "returned NoneType")]:
        with pytest.raises(CheckFailed, match=match):
            lab12.check_profile_steps(wrong)
    assert lab12.check_profile_steps(_stub).status == "not attempted"


def test_profile_check_prints_no_native_lines(capfd):
    """The profiler's native `USDT ... profiler_start` lines are captured at their source, not printed."""
    lab12.check_profile_steps(_profile_steps)
    out, err = capfd.readouterr()
    assert "USDT" not in err and "profiler_start" not in err and "CUDA is not available" not in err


# ---------------------------------------------------------------- 12.7 top operator
def _top_op(averages, device="cpu"):
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    top = max((a for a in averages if a.key.startswith("aten::")), key=lambda a: getattr(a, key))
    return top.key, top.input_shapes, getattr(top, key)


def test_top_op():
    assert lab12.check_top_op(_top_op).passed
    by = lambda attr, aten=True: (lambda avgs, device="cpu": (lambda t: (t.key, t.input_shapes, getattr(t, attr)))(  # noqa: E731
        max((a for a in avgs if a.key.startswith("aten::") or not aten), key=lambda a: getattr(a, attr))))
    for wrong, match in [(by("cpu_time_total"), "TOTAL time"), (by("self_cpu_time_total"), "launch"),
                         (by("self_cpu_time_total", aten=False), "record_function range|Python frame"),
                         (lambda a, d: _top_op(a, d)[:2], "return a tuple"),
                         (lambda a, d: (_top_op(a, d)[0], [], _top_op(a, d)[2]), "shapes"),
                         (lambda a, d: (*_top_op(a, d)[:2], _top_op(a, d)[2] / 1e3), "self time")]:
        with pytest.raises(CheckFailed, match=match):
            lab12.check_top_op(wrong)
    assert lab12.check_top_op(_stub).status == "not attempted"


def test_top_op_on_a_real_profile():
    """The right answer on real key_averages: an aten op and its shapes."""
    from torch.profiler import profile
    a = torch.randn(64, 64)
    with profile(record_shapes=True) as prof:
        (a @ a).relu()
    name, shapes, us = _top_op(prof.key_averages(group_by_input_shape=True))
    assert name.startswith("aten::") and us > 0 and isinstance(shapes, list)


@pytest.mark.parametrize("check, reference", [
    (lab12.check_idle_share, lambda events, window: traces.idle_share(events, window)),
    (lab12.check_idle_share, lambda events, window: 1 - sum(t - s for s, t in traces.merged_intervals(events, window))
     / (window[1] - window[0])),
    (lab12.check_equivalent, lambda ref, got: capstone.equivalent(ref, got)),
    (lab12.check_corrected_share, lambda *a: capstone.corrected_share(*a)),
    (lab12.check_keep_or_revert, lambda *a: capstone.keep_or_revert(*a)),
])
def test_calling_the_reference_is_caught(check, reference):
    with pytest.raises(CheckFailed, match="reference this exercise asks you to write"):
        check(reference)


def test_crash_names_the_call_and_seed_replays():
    def crashes(events, window):
        raise ZeroDivisionError("oops")
    with pytest.raises(CheckFailed, match=r"idle_share\(<4 events>.*ZeroDivisionError.*seed (\d+)"):
        lab12.check_idle_share(crashes)
    failed = []
    for seed in (5, 5):
        try:
            lab12.check_idle_share(lambda e, w: 0.5, seed=seed)
        except CheckFailed as exc:
            failed.append(str(exc))
    assert len(failed) == 2 and failed[0] == failed[1] and "seed 5" in failed[0]


# ---------------------------------------------------------------- 12.4 the paired guard (the build exercise)
def guard(current, candidate, bar=0.02, pairs=8, max_pairs=24, rng=None, clock=None, sync=lambda: None, *,
          warm=True, synced=True, order="random", invert=False, rule="interval", bar_scale=1.0, stop_after=None,
          revert_open=False, words=("keep", "revert", "undecided"), cap=">", cumulative=False):
    """A learner's guard with one mistake switched on at a time (the defaults are right)."""
    import random
    import statistics
    rng = rng or random.Random()
    steps = {"current": current, "candidate": candidate}
    if warm:
        for fn in steps.values():
            fn()
        sync()
    ratios = []
    while True:
        for _ in range(pairs):
            names = rng.sample(list(steps), 2) if order == "random" else ["current", "candidate"]
            took, start = {}, clock()
            for name in names:
                if not cumulative:
                    start = clock()
                steps[name]()
                if synced:
                    sync()
                took[name] = clock() - start
            ratios.append(took["candidate"] / took["current"] if invert else took["current"] / took["candidate"])
        if rule == "extremes":
            low, high = min(ratios), max(ratios)
        elif rule == "median":
            low = high = statistics.median(ratios)
        else:
            low, high = capstone.median_interval(ratios)
        line = 1 + bar * bar_scale
        if low > (1 if rule == "no bar" else line):
            return words[0], ratios
        if high < line or (revert_open and statistics.median(ratios) < line):
            return words[1], ratios
        if stop_after and len(ratios) >= stop_after:
            return words[2], ratios
        if (len(ratios) + pairs > max_pairs) if cap == ">" else (len(ratios) > max_pairs):
            return words[2], ratios


GUARD_WRONG = [
    (dict(synced=False), "still queued"),
    (dict(warm=False), "no warm-up"),
    (dict(order="fixed"), "order at random"),
    (dict(invert=True), "t_candidate / t_current"),
    (dict(rule="median"), "kept on the median"),
    (dict(rule="no bar"), "clears 1 but not 1 \\+ bar"),
    (dict(bar_scale=100.0), "percentage"),
    (dict(stop_after=6), "another batch of 6 fits"),
    (dict(revert_open=True), "reverted while the interval"),
    (dict(cap=">="), "max_pairs is a limit"),
    (dict(rule="extremes"), "already lay above"),
    (dict(words=("kept", "reverted", "undecided")), "return one of"),
    (dict(cumulative=True), "time each run alone"),
]


def test_keep_or_revert_right_and_stub():
    assert lab12.check_keep_or_revert(guard).passed
    assert lab12.check_keep_or_revert(own_copy(capstone.keep_or_revert)).passed
    assert lab12.check_keep_or_revert(_stub).status == "not attempted"


@pytest.mark.parametrize("mistake, words", GUARD_WRONG, ids=[next(iter(m)) + "=" + str(next(iter(m.values())))
                                                              for m, _ in GUARD_WRONG])
def test_keep_or_revert_names_the_mistake(mistake, words):
    import functools
    with pytest.raises(CheckFailed, match=words):
        lab12.check_keep_or_revert(functools.partial(guard, **mistake))


def test_guard_interval_and_decision():
    assert capstone.median_rank(5) == 1 and capstone.median_rank(12) == 3 and capstone.median_rank(4) == 1
    assert capstone.coverage(5, 1) == pytest.approx(1 - 2 / 32) and capstone.coverage(4, 1) < 0.9
    assert capstone.median_interval([3, 1, 2, 5, 4]) == (1, 5)
    assert capstone.decide([1.5] * 6) == "keep" and capstone.decide([1.0] * 6) == "revert"
    assert capstone.decide([0.9, 1.1, 1.0, 1.05, 0.95, 1.02]) is None
    with pytest.raises(ValueError, match="bar=2"):
        capstone.decide([1.0] * 6, bar=2)


# ---------------------------------------------------------------- right answers written differently (issue 46)
def _idle_by_boundaries(events, window):
    """+1 / -1 at each clipped start and end, swept in time order: busy while the count is above zero."""
    lo, hi = window
    marks = sorted([(max(e["ts"], lo), 1) for e in events if min(e["ts"] + e["dur"], hi) > max(e["ts"], lo)]
                   + [(min(e["ts"] + e["dur"], hi), -1) for e in events if min(e["ts"] + e["dur"], hi) >
                      max(e["ts"], lo)], key=lambda m: (m[0], -m[1]))
    busy, depth, since = 0.0, 0, lo
    for t, step in marks:
        if depth > 0:
            busy += t - since
        depth, since = depth + step, t
    return (hi - lo - busy) / (hi - lo)


def _sorted_by_hand(x, weights, indices, w_gate, w_up, w_down, act):
    """No lab-06 helpers: argsort by hand, slice per expert, index_add back."""
    k = indices.shape[1]
    flat = indices.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w_gate.shape[0]).tolist()
    rows = x.index_select(0, order // k)
    gates, ups, downs = w_gate.unbind(0), w_up.unbind(0), w_down.unbind(0)
    outs = torch.cat([act(r @ gates[e], r @ ups[e]) @ downs[e] for e, r in enumerate(rows.split(counts))])
    w = weights.reshape(-1).index_select(0, order).unsqueeze(1)
    return torch.zeros_like(x).index_add(0, order // k, outs * w)


def _grouped_einsum(x, weights, indices, w_gate, w_up, w_down, act):
    """Grouped through einsum on the padded buffer, the plan's own attributes read (num_experts, offsets)."""
    t, k = indices.shape
    plan = moe.dispatch_plan(indices, w_gate.shape[0])
    e, cap = plan.num_experts, max(int(plan.counts.max()), 1)
    flat = indices.reshape(-1)[plan.order]
    slot = flat * cap + torch.arange(t * k) - plan.offsets[flat]
    buf = x.new_zeros(e * cap, x.shape[1]).index_copy(0, slot, moe.dispatch(x, plan)).view(e, cap, -1)
    h = act(torch.einsum("ech,ehf->ecf", buf, w_gate), torch.einsum("ech,ehf->ecf", buf, w_up))
    y = torch.einsum("ecf,efh->ech", h, w_down).reshape(e * cap, -1)[slot]
    return moe.combine(y, plan, weights, t)


def _profile_started_by_hand(step, trace_path, wait, warmup, active, device):
    from torch.profiler import ProfilerActivity, profile, schedule
    acts = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device == "cuda" else [])]
    prof = profile(activities=acts, schedule=schedule(wait=wait, warmup=warmup, active=active), record_shapes=True,
                   with_stack=True)
    prof.start()
    for _ in range(wait + warmup + active):
        step()
        prof.step()
    prof.stop()
    prof.export_chrome_trace(trace_path)
    return prof


def test_right_answers_written_differently_pass():
    assert lab12.check_idle_share(_idle_by_boundaries).passed
    assert lab12.check_corrected_share(lambda p, po, pr, o, u: sorted((0.0, (p - po * (pr - u) / o) / u, 1.0))[1]).passed
    assert lab12.check_moe_sorted_forward(_sorted_by_hand).passed
    assert lab12.check_moe_grouped_forward(_grouped_einsum).passed
    assert lab12.check_profile_steps(_profile_started_by_hand).passed
    assert lab12.check_top_op(_top_by_sorting).passed


def _top_by_sorting(averages, device="cpu"):
    """The last of the aten rows sorted by self time."""
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    rows = sorted((a for a in averages if a.key.startswith("aten::")), key=lambda a: getattr(a, key))
    return rows[-1].key, rows[-1].input_shapes, getattr(rows[-1], key)

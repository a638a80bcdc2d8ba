import pytest
import torch
from learner import own_copy

from common.core import traces
from common.core.checks import CheckFailed
from common.exercises import lab12
from common.moe import moe
from common.systems import capstone


def _stub(*a):
    raise NotImplementedError("Exercise 12.x")


# ---------------------------------------------------------------- 12.1 grouped MoE forward
def _grouped(x, weights, indices, w_gate, w_up, w_down, act):
    """A learner's right answer, written independently of capstone.moe_grouped_forward."""
    t, k = indices.shape
    e1 = w_gate.shape[0]
    idx = torch.cat([indices, torch.full((t, 1), e1 - 1, dtype=indices.dtype)], 1)
    wts = torch.cat([weights, torch.ones(t, 1, dtype=weights.dtype)], 1)
    plan = moe.dispatch_plan(idx, e1)
    counts = plan.counts.tolist()
    xs = moe.dispatch(x, plan).split(counts)
    gate = torch.cat([xe @ w_gate[e] for e, xe in enumerate(xs)])
    up = torch.cat([xe @ w_up[e] for e, xe in enumerate(xs)])
    h = act(gate, up).split(counts)
    ys = torch.cat([he @ w_down[e] for e, he in enumerate(h)])
    return moe.combine(ys, plan, wts, t)


def _no_shared(x, weights, indices, w_gate, w_up, w_down, act):
    t, k = indices.shape
    e1 = w_gate.shape[0]
    plan = moe.dispatch_plan(indices, e1)
    counts = plan.counts.tolist()
    xs = moe.dispatch(x, plan).split(counts)
    gate = torch.cat([xe @ w_gate[e] for e, xe in enumerate(xs)])
    up = torch.cat([xe @ w_up[e] for e, xe in enumerate(xs)])
    h = act(gate, up).split(counts)
    ys = torch.cat([he @ w_down[e] for e, he in enumerate(h)])
    return moe.combine(ys, plan, weights, t)


def _unweighted(x, weights, indices, *ws):
    return _grouped(x, torch.ones_like(weights), indices, *ws)


def _act_per_expert(x, weights, indices, w_gate, w_up, w_down, act):
    t, k = indices.shape
    e1 = w_gate.shape[0]
    idx = torch.cat([indices, torch.full((t, 1), e1 - 1, dtype=indices.dtype)], 1)
    wts = torch.cat([weights, torch.ones(t, 1, dtype=weights.dtype)], 1)
    plan = moe.dispatch_plan(idx, e1)
    xs = moe.dispatch(x, plan).split(plan.counts.tolist())
    ys = torch.cat([act(xe @ w_gate[e], xe @ w_up[e]) @ w_down[e] for e, xe in enumerate(xs)])
    return moe.combine(ys, plan, wts, t)


def _loop(x, weights, indices, w_gate, w_up, w_down, act):
    rows = []
    gates, ups, downs = w_gate.unbind(0), w_up.unbind(0), w_down.unbind(0)
    for t in range(x.shape[0]):
        xt = x[t:t + 1]
        acc = act(xt @ gates[-1], xt @ ups[-1]) @ downs[-1]
        for j in range(indices.shape[1]):
            e = int(indices[t, j])
            acc = acc + weights[t, j] * (act(xt @ gates[e], xt @ ups[e]) @ downs[e])
        rows.append(acc)
    return torch.cat(rows)


def _one_act_loop(x, weights, indices, w_gate, w_up, w_down, act):
    """act once on all rows, but a matmul per assignment (T*(k+1) tiny GEMMs)."""
    t, k = indices.shape
    e1 = w_gate.shape[0]
    idx = torch.cat([indices, torch.full((t, 1), e1 - 1, dtype=indices.dtype)], 1).reshape(-1)
    xs = x.repeat_interleave(k + 1, 0)
    gate = torch.cat([xs[i:i + 1] @ w_gate[int(idx[i])] for i in range(len(idx))])
    up = torch.cat([xs[i:i + 1] @ w_up[int(idx[i])] for i in range(len(idx))])
    h = act(gate, up)
    ys = torch.cat([h[i:i + 1] @ w_down[int(idx[i])] for i in range(len(idx))])
    wts = torch.cat([weights, torch.ones(t, 1, dtype=weights.dtype)], 1).reshape(-1, 1)
    return (ys * wts).view(t, k + 1, -1).sum(1)


def _detached(*args):
    return _grouped(*args).detach()


def _calls_reference(x, weights, indices, w_gate, w_up, w_down, act):
    return capstone.moe_grouped_forward(x, weights, indices, w_gate, w_up, w_down, act)


def _modifies_input(x, weights, indices, *rest):
    weights /= weights.sum(-1, keepdim=True).detach()
    return _grouped(x, weights, indices, *rest)


def test_moe_grouped_forward():
    assert lab12.check_moe_grouped_forward(_grouped).passed
    for wrong, match in [(_no_shared, "shared expert"), (_unweighted, "gate weight"),
                         (_act_per_expert, "called .* times"), (_loop, "called .* times"),
                         (_one_act_loop, "matrix multiplications"), (_detached, "backward|gradient"),
                         (_calls_reference, "write it")]:
        with pytest.raises(CheckFailed, match=match):
            lab12.check_moe_grouped_forward(wrong)
    assert lab12.check_moe_grouped_forward(_stub).status == "not attempted"


def _sorts_indices_in_place(x, weights, indices, *rest):
    out = _grouped(x, weights, indices, *rest)
    indices.copy_(indices.sort(dim=1).values)  # tidy the routes for later: the caller's tensor changes
    return out


def _normalises_weights_in_place(x, weights, indices, *rest):
    with torch.no_grad():
        weights.div_(weights.sum(-1, keepdim=True))
    return _grouped(x, weights, indices, *rest)


@pytest.mark.parametrize("wrong, match", [(_modifies_input, "in-place|backward"),  # autograd refuses this one
                                          (_sorts_indices_in_place, "modified its input indices in place"),
                                          (_normalises_weights_in_place, "modified its input weights in place")])
def test_moe_grouped_forward_rejects_modified_input(wrong, match):
    """The checker compares what the learner's function RECEIVED with the originals (it used to compare its own
    copies, which the function never saw)."""
    with pytest.raises(CheckFailed, match=match):
        lab12.check_moe_grouped_forward(wrong)


# ---------------------------------------------------------------- 12.2 idle share
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
    for wrong, match in [(_summed, "counted twice"), (_between_ops, "edges"), (_unclipped, "clip"),
                         (lambda e, w: 1 - _idle(e, w), "BUSY"), (lambda e, w: 100 * _idle(e, w), "percentage"),
                         (_sorted_assumed, "idle share for")]:
        with pytest.raises(CheckFailed, match=match):
            lab12.check_idle_share(wrong)
    assert lab12.check_idle_share(_stub).status == "not attempted"


# ---------------------------------------------------------------- 12.3 equivalence
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


@pytest.mark.parametrize("check, reference", [
    (lab12.check_idle_share, lambda events, window: traces.idle_share(events, window)),
    (lab12.check_idle_share, lambda events, window: 1 - sum(t - s for s, t in traces.merged_intervals(events, window))
     / (window[1] - window[0])),
    (lab12.check_equivalent, lambda ref, got: capstone.equivalent(ref, got)),
])
def test_calling_the_reference_is_caught(check, reference):
    with pytest.raises(CheckFailed, match="reference this exercise asks you to write"):
        check(reference)


def test_crash_names_the_call_and_seed_replays():
    def crashes(events, window):
        raise ZeroDivisionError("oops")
    with pytest.raises(CheckFailed, match=r"idle_share\(<3 events>.*ZeroDivisionError.*seed (\d+)"):
        lab12.check_idle_share(crashes)
    failed = []
    for seed in (5, 5):
        try:
            lab12.check_idle_share(lambda e, w: 0.5, seed=seed)
        except CheckFailed as exc:
            failed.append(str(exc))
    assert len(failed) == 2 and failed[0] == failed[1] and "seed 5" in failed[0]

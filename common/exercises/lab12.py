"""Checkers for lab 12 (the profiling loop): the grouped MoE forward, idle share from a trace, equivalence."""
from __future__ import annotations

import random

import torch

from common.core import traces
from common.core.checks import CheckFailed, checker, expect, expect_close, fail
from common.exercises.cases import learner_call, replayable
from common.systems import capstone


def _seeded(seed):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------- 12.3
def _moe_case(tokens, hidden, ffn, experts, k, seed, unused=()):
    g = _seeded(seed)
    x = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    allowed = torch.tensor([e for e in range(experts) if e not in unused])
    scores = torch.rand(tokens, len(allowed), generator=g)
    indices = allowed[scores.topk(k, dim=1).indices]
    weights = torch.rand(tokens, k, generator=g, dtype=torch.float64) + 0.1
    ws = [torch.randn(experts + 1, hidden, ffn, generator=g, dtype=torch.float64) / hidden ** 0.5,
          torch.randn(experts + 1, hidden, ffn, generator=g, dtype=torch.float64) / hidden ** 0.5,
          torch.randn(experts + 1, ffn, hidden, generator=g, dtype=torch.float64) / ffn ** 0.5]
    return x, weights, indices, ws


class _MatmulCounter(torch.utils._python_dispatch.TorchDispatchMode):
    MATMULS = {"mm", "bmm", "addmm", "baddbmm", "matmul", "dot", "mv", "addmv"}

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.MATMULS:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def _forward_and_grads(fn, x, weights, indices, ws, act, call=None, used=None):
    """fn on fresh leaf copies; with `call`, fn is the learner's (a crash is a verdict naming the call, and a call to
    capstone's own layer is added to `used`)."""
    leaves = [t.clone().requires_grad_() for t in (x, weights, *ws)]
    args = (leaves[0], leaves[1], indices.clone(), leaves[2], leaves[3], leaves[4], act)
    if call is None:
        return fn(*args), leaves
    out = learner_call(fn, args, call, (capstone.moe_grouped_forward, capstone.moe_loop_forward), used)
    for name, given, original in zip(("x", "weights", "indices", "w_gate", "w_up", "w_down"), args,
                                     (x, weights, indices, *ws)):  # what the learner received, not our copies
        expect(torch.equal(given.detach(), original), f"{call}: your function modified its input {name} in place; "
                                                      f"work on copies (or out-of-place ops)")
    return out, leaves


@checker("12.3", "grouped MoE forward", in_kernel="it back-propagates through the learner's layer")
@replayable
def check_moe_grouped_forward(fn, cases):
    """fn(x [T,H], weights [T,k], indices [T,k], w_gate [E+1,H,F], w_up [E+1,H,F], w_down [E+1,F,H], act) -> [T,H]:
    the shared expert (index E) on every token plus each token's k experts weighted, grouped by expert."""
    seed = cases.seed
    # (tokens, hidden, ffn, experts, k, unused experts): asymmetric sizes, one expert left unused, k=1 and k>1
    cases = [(29, 12, 8, 5, 2, (1,)), (16, 8, 20, 3, 1, ()), (41, 16, 12, 6, 3, (0, 4))]
    for i, (t, h, f, e, k, unused) in enumerate(cases):
        where = f"T={t}, H={h}, F={f}, E={e} routed + 1 shared, k={k}, unused experts {list(unused)} (seed {seed})"
        x, weights, indices, ws = _moe_case(t, h, f, e, k, seed + i, unused)
        rows = []

        def act(gate, up):
            rows.append(tuple(gate.shape))
            return capstone.swiglu_act(gate, up)

        counter = _MatmulCounter()
        used: set = set()
        with counter:
            out, leaves = _forward_and_grads(fn, x, weights, indices, ws, act,
                                             f"moe_grouped_forward(x, weights, indices, w_gate, w_up, w_down, act) "
                                             f"for {where}", used)
        if used:
            fail(f"{where}: you called common.systems.capstone's own MoE layer; this exercise is to write it (common.moe.moe's "
                 f"dispatch_plan / dispatch / combine are the parts to use)")
        expect(isinstance(out, torch.Tensor), f"{where}: expected a tensor [T, H], got {type(out).__name__}")
        expected = capstone.moe_grouped_forward(x, weights, indices, *ws)
        if out.shape == expected.shape and not torch.allclose(out.detach(), expected, rtol=1e-9, atol=1e-10):
            shared = capstone.expert_ffn(x, e, *[w.unbind(0) for w in ws])
            routed = expected - shared
            unweighted = capstone.moe_grouped_forward(x, torch.ones_like(weights), indices, *ws)
            if torch.allclose(out.detach(), routed, rtol=1e-9, atol=1e-10):
                fail(f"{where}: your output is the routed experts alone -- the shared expert (index E={e}, the last "
                     f"of the stacked weights) runs on every token with weight 1 and is added to every output")
            if torch.allclose(out.detach(), unweighted, rtol=1e-9, atol=1e-10):
                fail(f"{where}: every expert's output was added with weight 1 -- multiply each routed expert's "
                     f"output by that token's gate weight (weights[t, j])")
            if torch.allclose(out.detach(), shared, rtol=1e-9, atol=1e-10):
                fail(f"{where}: your output is the shared expert alone -- the routed experts' contributions are "
                     f"missing (are the outputs scattered back to their tokens?)")
        expect_close(out.detach(), expected, f"MoE output for {where}", rtol=1e-9, atol=1e-10)
        probe = torch.randn(expected.shape, generator=_seeded(seed + 100 + i), dtype=torch.float64)
        try:
            (out * probe).sum().backward()
        except RuntimeError as exc:
            fail(f"{where}: the backward pass failed ({exc}); build the output from differentiable ops (no "
                 f".detach(), no .data, no in-place writes into a tensor that needs grad)")
        ref_out, ref_leaves = _forward_and_grads(capstone.moe_grouped_forward, x, weights, indices, ws,
                                                 capstone.swiglu_act)
        (ref_out * probe).sum().backward()
        for name, got, ref in zip(("x", "weights", "w_gate", "w_up", "w_down"), leaves, ref_leaves):
            expect(got.grad is not None, f"{where}: no gradient reached {name}; the layer must be differentiable "
                                         f"with respect to it")
            expect_close(got.grad, ref.grad, f"gradient of {name} for {where}", rtol=1e-8, atol=1e-10)
        routed_rows = t * (k + 1)
        expect(len(rows) > 0, f"{where}: `act` was never called; apply the act you are given (later it is the "
                              f"compiled one) to the gate/up projections")
        if len(rows) > 1:
            fail(f"{where}: `act` was called {len(rows)} times (on {rows[:4]}{'...' if len(rows) > 4 else ''}); call "
                 f"it ONCE on all {routed_rows} dispatched rows [T*(k+1), F], so a compiled act sees one shape")
        expect(rows[0][0] == routed_rows, f"{where}: `act` ran on {rows[0][0]} rows; it should run once on all "
                                          f"T*(k+1) = {routed_rows} dispatched rows (the shared expert included)")
        limit = 3 * (e + 1)
        expect(counter.calls <= limit,
               f"{where}: the forward made {counter.calls} matrix multiplications; a grouped layer makes at most "
               f"3 per expert ({limit} here) -- a per-token (or per-assignment) loop makes 3 x T x (k+1) = "
               f"{3 * routed_rows}")
    return "output and gradients match; one act call; at most 3 matmuls per expert"


# ---------------------------------------------------------------------------------------------- 12.1
def _idle_cases(seed):
    rng = random.Random(seed)
    ev = lambda ts, dur, tid=1, name="aten::op": {"name": name, "ts": float(ts), "dur": float(dur), "tid": tid}
    cases = [
        # nested: a parent op and its child -- busy 0..60, idle 40 of 100
        ([ev(0, 60), ev(10, 30), ev(15, 5)], (0, 100), "nested"),
        # gaps before the first and after the last op
        ([ev(20, 10), ev(50, 20)], (0, 100), "edges"),
        # ops sticking out of the window on both sides, listed out of order
        ([ev(80, 40), ev(-20, 30), ev(40, 10)], (0, 100), "clip"),
        # two threads overlapping
        ([ev(0, 50, 1), ev(25, 50, 2), ev(90, 5, 1)], (0, 100), "threads"),
        ([], (0, 10), "empty"),
    ]
    for _ in range(3):
        n = rng.randint(5, 40)
        lo = rng.uniform(-50, 50)
        hi = lo + rng.uniform(200, 1000)
        events = []
        for _ in range(n):
            ts = rng.uniform(lo - 50, hi)
            events.append(ev(ts, rng.uniform(0, 80), rng.choice([1, 1, 2])))
            if rng.random() < 0.4:  # a nested child
                events.append(ev(ts + 1, rng.uniform(0, 0.5) * events[-1]["dur"], events[-1]["tid"]))
        rng.shuffle(events)
        cases.append((events, (lo, hi), "random"))
    return cases


@checker("12.1", "idle share from a trace")
@replayable
def check_idle_share(fn, cases):
    """fn(events, window) -> fraction of window (start, end) in which no event (dicts: ts, dur in us) runs."""
    seed = cases.seed
    for events, window, kind in _idle_cases(seed):
        given = [dict(e) for e in events]
        got = learner_call(fn, (given, window), f"idle_share(<{len(events)} events>, {tuple(window)}) ({kind} case)",
                           (traces.idle_share, traces.merged_intervals))
        expect(given == events, f"your function modified the events list (case {kind!r}); read it, do not change it")
        expected = traces.idle_share(events, window)
        lo, hi = window
        span = hi - lo
        where = f"{len(events)} events, window {tuple(round(w, 1) for w in window)} ({kind} case, seed {seed})"
        try:
            g = float(got)
        except (TypeError, ValueError):
            fail(f"{where}: expected a fraction (a float in [0, 1]), got {type(got).__name__} {got!r}")
        summed = 1 - sum(min(e["ts"] + e["dur"], hi) - max(e["ts"], lo) for e in events
                         if e["ts"] + e["dur"] > lo and e["ts"] < hi) / span
        unclipped = 1 - sum(t - s for s, t in traces.merged_intervals(events)) / span
        if events:
            first, last = min(e["ts"] for e in events), max(e["ts"] + e["dur"] for e in events)
            inner = traces.idle_share(events, (first, last)) if last > first else None
        if abs(expected - g) > 1e-9:
            if abs(g - 100 * expected) < 1e-6 and expected > 0:
                fail(f"{where}: got {g:.6g}, a percentage; return a fraction in [0, 1] ({expected:.6g})")
            if abs(g - (1 - expected)) < 1e-9:
                fail(f"{where}: got {g:.6g}, the BUSY share; idle share = 1 - busy = {expected:.6g}")
            if kind in ("nested", "threads") and abs(g - summed) < 1e-9:
                fail(f"{where}: got {g:.6g}: you added up the events' durations, so nested and overlapping events "
                     f"were counted twice -- merge the intervals first (expected {expected:.6g})")
            if events and inner is not None and abs(g - inner) < 1e-9:
                fail(f"{where}: got {g:.6g}, the idle share between the first op's start and the last op's end; the "
                     f"window's edges count too -- time before the first op is idle (expected {expected:.6g})")
            if kind == "clip" and abs(g - unclipped) < 1e-9:
                fail(f"{where}: got {g:.6g}: events sticking out of the window were counted in full; clip each to the "
                     f"window (expected {expected:.6g})")
        expect_close(g, expected, f"idle share for {where}", rtol=0, atol=1e-9)
    return "overlaps merged, clipped to the window, edges counted"


# ---------------------------------------------------------------------------------------------- 12.2
def _tensors(seed, out_scale=300.0, grad_scale=1e-7):
    g = _seeded(seed)
    out = torch.randn(256, 640, generator=g) * out_scale  # 160k elements: one wrong element is 1e-4 of a norm
    out[::7] = 0.0  # exact zeros where rounding noise still lands
    return {"out": out, "grad.w": torch.randn(48, 32, generator=g) * 0.5,
            "grad.bias": torch.randn(32, generator=g) * grad_scale}


def _noisy(ref, rel, seed, keys=None):
    g = _seeded(seed)
    out = {}
    for key, t in ref.items():
        if keys is None or key in keys:
            scale = float(t.abs().max())
            out[key] = t + rel * scale * (2 * torch.rand(t.shape, generator=g) - 1)
        else:
            out[key] = t.clone()
    return out


def _cases(seed):
    ref = _tensors(seed)
    right = [("identical", ref, {k: v.clone() for k, v in ref.items()}),
             ("fp32 rounding noise (2e-6 of each tensor's largest value, zeros included)", ref,
              _noisy(ref, 2e-6, seed))]
    wrong = []
    bad = {k: v.clone() for k, v in ref.items()}
    bad["grad.bias"] = -bad["grad.bias"]
    wrong.append(("tiny", "a gradient of magnitude 1e-7 with its sign flipped (100% wrong)", ref, bad))
    bad = _noisy(ref, 0.0, seed)
    bad["grad.w"] = bad["grad.w"] * 1.01
    wrong.append(("grad", "output right, one gradient 1% off", ref, bad))
    bad = {k: v.clone() for k, v in ref.items()}
    bad["out"][3] += 0.01 * float(ref["out"].abs().max())
    wrong.append(("loose", "one token's output off by 1% of the output's scale (a dropped expert)", ref, bad))
    bad = {k: v.clone() for k, v in ref.items()}
    bad["out"][7, 11] = ref["out"][7, 11] + 0.01 * float(ref["out"].abs().max())
    wrong.append(("element", "ONE element of the output off by 1% of the output's scale", ref, bad))
    bad = {k: v.clone() for k, v in ref.items()}
    bad["grad.w"] = None
    wrong.append(("missing", "a gradient that was never computed (None)", ref, bad))
    bad = {k: v.clone() for k, v in ref.items()}
    bad["out"][5, 5] = float("nan")
    wrong.append(("nan", "a NaN in the output", ref, bad))
    bad = {k: v.clone() for k, v in ref.items()}
    bad["grad.bias"] = ref["grad.bias"].unsqueeze(0).expand(48, 32).clone()
    wrong.append(("shape", "a gradient of the wrong shape [48, 32] that broadcasts against [32]", ref, bad))
    bad = {k: v.clone() for k, v in ref.items()}
    del bad["grad.bias"]
    wrong.append(("keys", "a result missing one of the reference's tensors", ref, bad))
    return right, wrong


_WHY = {
    "tiny": "an absolute tolerance cannot see errors in small gradients -- scale the tolerance by each tensor's "
            "magnitude (e.g. rtol x max|ref|)",
    "grad": "compare every gradient, not only the output: a wrong backward leaves the output right",
    "loose": "the tolerance is too loose: a real bug (1% of the scale on one token) passed; fp32 rounding here is "
             "about 1e-6 of the scale, so something like 1e-4 x max|ref| separates the two",
    "element": "a mean (or a norm over all elements) hides one wrong element among thousands -- compare the "
               "LARGEST error, max|got - ref|, with rtol x max|ref|",
    "missing": "a gradient that is None (never computed) is a failure, not a pass",
    "nan": "NaN compares false with everything: check for it (torch.isfinite) or write the test so NaN fails",
    "shape": "check shapes first: broadcasting makes differently shaped tensors look close",
    "keys": "the two results must hold the same tensors (same keys)",
}


@checker("12.2", "equivalence check with a sensible tolerance")
@replayable
def check_equivalent(fn, cases):
    """fn(ref, got) -> True when got's output and gradients (dicts name -> tensor or None) match ref's within a
    tolerance that accepts float32 rounding and rejects real bugs."""
    seed = cases.seed
    right, wrong = _cases(seed)
    for what, ref, got in right:
        verdict = learner_call(fn, ({k: v.clone() for k, v in ref.items()}, got), f"equivalent(ref, got) for {what}",
                               (capstone.equivalent,))
        if verdict is not True and verdict is not False and not isinstance(verdict, (bool, torch.Tensor)):
            fail(f"expected True or False, got {type(verdict).__name__} {verdict!r}")
        if not bool(verdict):
            hint = ("two identical results must pass" if what == "identical" else
                    "an exact comparison, a fixed absolute tolerance (outputs here reach ~1e3, so rounding is "
                    "~1e-3 in absolute terms) or an elementwise relative one like allclose (rounding noise lands "
                    "on exact zeros too) rejects it; compare max|got - ref| with rtol x max|ref| per tensor")
            fail(f"{what}: your check said NOT equivalent, but this is a correct result (seed {seed}): {hint}")
    passed = {}
    for key, what, ref, got in wrong:
        try:
            verdict = learner_call(fn, ({k: v.clone() for k, v in ref.items()}, got),
                                   f"equivalent(ref, got) for {what}", (capstone.equivalent,))
        except CheckFailed as exc:
            cause = exc.__cause__
            if not isinstance(cause, (KeyError, TypeError, AttributeError, RuntimeError)):
                raise
            fail(f"equivalent(ref, got) for {what}: your check crashed with {type(cause).__name__}: {cause}; return "
                 f"False instead ({_WHY[key]})")
        if bool(verdict):
            passed[key] = what
    if passed:
        # name the mistake that explains the most: gradients never compared pass both gradient cases
        if "grad" in passed and "tiny" in passed and "loose" not in passed:
            key = "grad"
        elif "loose" in passed:
            key = "loose"
        elif "element" in passed:
            key = "element"
        else:
            key = next(iter(passed))
        why = _WHY[key] + (f" -- or it averages: {_WHY['element']}" if key == "loose" and "element" in passed else "")
        also = [w for k, w in passed.items() if k != key]
        fail(f"{passed[key]}: your check said equivalent (seed {seed}); {why}"
             + (f". It also passed: {'; '.join(also)}" if also else ""))
    return "accepts rounding noise, rejects tiny-gradient, gradient-only, 1% output, None, NaN, shape and key errors"

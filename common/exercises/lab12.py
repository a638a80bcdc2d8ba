"""Checkers for lab 12 (the profiling loop): idle share from a trace (12.1), equivalence (12.2), a profile share
corrected for the profiler's overhead (12.3), the paired keep-or-revert guard (12.4, the build exercise), the sorted
dispatch (12.5), driving torch.profiler (12.6), the top operator by self time (12.7) and the grouped MoE forward
(12.8)."""
from __future__ import annotations

import torch

from common.core import traces
from common.core.checks import CheckFailed, checker, expect, expect_close, fail, near
from common.exercises import guard_checks, moe_checks, profile_checks
from common.exercises.cases import as_number, expect_number, learner_call, replayable
from common.systems import capstone


def _seeded(seed):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------- 12.5, 12.8
@checker("12.5", "sorted dispatch", in_kernel="it back-propagates through the learner's layer")
@replayable
def check_moe_sorted_forward(fn, cases):
    """fn(x [T,H], weights [T,k], indices [T,k], w_gate [E,H,F], w_up [E,H,F], w_down [E,F,H], act) -> [T,H]: the
    assignments sorted by expert once, each expert run on its contiguous slice, no boolean masks, no per-use
    full-size weight gradients."""
    for s in moe_checks.run_cases(fn, cases.seed, "moe_sorted(x, weights, indices, w_gate, w_up, w_down, act)"):
        masks = s.forward.count("nonzero", "masked_select", "masked_scatter", "index_put", "index_put_")
        expect(masks == 0, f"{s.where}: the forward selected rows with boolean masks ({masks} mask operations) -- "
                           f"that is the loop you are replacing; sort once (moe.dispatch_plan) and slice")
        per_use = s.backward.count("select_backward")
        expect(per_use < s.experts, f"{s.where}: the backward made {per_use} full-size weight gradients "
                                    f"(select_backward): indexing w_gate[e] inside the loop gives every use a "
                                    f"gradient the size of ALL experts' weights -- take each expert's weights "
                                    f"once, before the loop (w_gate.unbind(0))")
        expect(s.forward.matmuls <= 3 * s.experts, f"{s.where}: the forward made {s.forward.matmuls} matrix "
                                                   f"products; one expert's FFN makes 3, so at most "
                                                   f"{3 * s.experts}")
    return "output and gradients match; sorted once, no masks, weights split once"


@checker("12.8", "grouped MoE forward", in_kernel="it back-propagates through the learner's layer")
@replayable
def check_moe_grouped_forward(fn, cases):
    """fn(x [T,H], weights [T,k], indices [T,k], w_gate [E,H,F], w_up [E,H,F], w_down [E,F,H], act) -> [T,H]: each
    token's k routed experts weighted and summed, every weight applied as ONE batched GEMM over all experts."""
    for s in moe_checks.run_cases(fn, cases.seed, "moe_grouped(x, weights, indices, w_gate, w_up, w_down, act)"):
        e, calls = s.experts, s.forward.matmuls
        expect(calls <= 3, f"{s.where}: the forward made {calls} matrix multiplications; a grouped layer makes one "
                           f"batched GEMM per weight (3 in all, e.g. torch.bmm over zero-padded [E, capacity, H] "
                           f"slots) -- a loop over experts makes 3 x E = {3 * e}")
        rows = s.act_rows
        expect(len(rows) == 1, f"{s.where}: `act` was called {len(rows)} times (on {rows[:4]}); call it ONCE, on "
                               f"all experts' rows together")
        n = moe_checks.rows(rows[0])
        expect(n >= s.rows, f"{s.where}: `act` ran on {n} rows; it must see all T*k = {s.rows} dispatched rows")
    return "output and gradients match; one batched GEMM per weight; one act call"


# ---------------------------------------------------------------------------------------------- 12.1
@checker("12.1", "idle share from a trace")
@replayable
def check_idle_share(fn, cases):
    """fn(events, window) -> fraction of window (start, end) in which no event (dicts: ts, dur in us) runs."""
    seed = cases.seed
    for events, window, kind in profile_checks.idle_cases(seed):
        given = [dict(e) for e in events]
        got = learner_call(fn, (given, window), f"idle_share(<{len(events)} events>, {tuple(window)}) ({kind} case)",
                           (traces.idle_share, traces.merged_intervals), library=True)
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
            for end, value in (("start", profile_checks.one_end(events, window, lo=True)), ("end", profile_checks.one_end(events, window, lo=False))):
                if abs(g - value) < 1e-9:
                    fail(f"{where}: got {g:.6g}: you clipped the events only at the window's {end}; an event can stick "
                         f"out of either end -- clip both (expected {expected:.6g})")
            if abs(g - profile_checks.merged(events, window, in_order=True)) < 1e-9:
                fail(f"{where}: got {g:.6g}: you merged the events in the order given; a trace's events are not sorted "
                     f"by start time -- sort them (by ts) first (expected {expected:.6g})")
            if abs(g - profile_checks.merged(events, window, keep_max=False)) < 1e-9:
                fail(f"{where}: got {g:.6g}: a nested event (ending before its parent) moved your covered-up-to point "
                     f"back, so the rest of the parent was counted again -- keep covered_to = max(covered_to, end) "
                     f"(expected {expected:.6g})")
            if expected > 0 and abs(g - expected * span) < 1e-6 * span:
                fail(f"{where}: got {g:.6g}, the idle TIME in microseconds; return it as a fraction of the window "
                     f"(divide by its length: {expected:.6g})")
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


def _why_refused(fn, ref, seed):
    """Why a check refused rounding noise, told by two probes: the same noise on results 1e5 times smaller (a fixed
    absolute tolerance accepts it), and noise proportional to each element, none on the zeros (allclose accepts it)."""
    fix = "; compare max|got - ref| with rtol x max|ref| per tensor"
    small = {k: v * 1e-5 for k, v in ref.items()}
    if bool(learner_call(fn, (small, _noisy(small, 2e-6, seed)), "equivalent(ref, got)", library=True)):
        return ("a fixed absolute tolerance: it passed the same rounding noise on results 1e5 times smaller; the "
                "outputs here reach ~1e3, so their rounding is ~1e-3 in absolute terms" + fix)
    relative = {k: v * (1 + 1e-7) for k, v in ref.items()}
    if bool(learner_call(fn, (ref, relative), "equivalent(ref, got)", library=True)):
        return ("an elementwise relative test like allclose (|got - ref| <= rtol |ref| + atol per element): rounding "
                "noise lands on exact zeros too, where no relative tolerance is left" + fix)
    return "an exact comparison (torch.equal, ==): float32 rounding changes the last bits" + fix


@checker("12.2", "equivalence check with a sensible tolerance")
@replayable
def check_equivalent(fn, cases):
    """fn(ref, got) -> True when got's output and gradients (dicts name -> tensor or None) match ref's within a
    tolerance that accepts float32 rounding and rejects real bugs."""
    seed = cases.seed
    right, wrong = _cases(seed)
    for what, ref, got in right:
        verdict = learner_call(fn, ({k: v.clone() for k, v in ref.items()}, got), f"equivalent(ref, got) for {what}",
                               (capstone.equivalent,), library=True)
        if verdict is not True and verdict is not False and not isinstance(verdict, (bool, torch.Tensor)):
            fail(f"expected True or False, got {type(verdict).__name__} {verdict!r}")
        if not bool(verdict):
            hint = "two identical results must pass" if what == "identical" else _why_refused(fn, ref, seed)
            fail(f"{what}: your check said NOT equivalent, but this is a correct result (seed {seed}): {hint}")
    passed = {}
    for key, what, ref, got in wrong:
        try:
            verdict = learner_call(fn, ({k: v.clone() for k, v in ref.items()}, got),
                                   f"equivalent(ref, got) for {what}", (capstone.equivalent,), library=True)
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
    return ("accepts rounding noise, rejects tiny-gradient, gradient-only, 1% output, None, not-a-number, shape and "
            "key errors")


# ---------------------------------------------------------------------------------------------- 12.3
def _raw_share(part, part_ops, prof_ms, ops, unprof):
    return (part - part_ops * (prof_ms - unprof) / ops) / unprof


@checker("12.3", "a profile share corrected for the profiler's overhead")
@replayable
def check_corrected_share(fn, cases):
    """fn(part_ms, part_ops, profiled_ms, ops, unprofiled_ms) -> the part's share of the UNPROFILED step."""
    rng = cases.rng
    # the last two fixed cases need the clip: a part of many cheap operators corrects below 0, a part whose profiled
    # time outgrew the step (measured in another round) above 1
    fixed = [(900.0, 17000, 1000.0, 18000, 400.0), (60.0, 400, 100.0, 1000, 80.0), (10.0, 50, 50.0, 2000, 45.0),
             (6.0, 900, 100.0, 1000, 50.0), (70.0, 10, 100.0, 1000, 40.0)]
    randoms = []
    for _ in range(3):
        ops = rng.randint(500, 40000)
        unprof = rng.uniform(20, 500)
        per_op = rng.uniform(0.2, 3.0) * unprof / ops  # ms per op: the profiler adds 20-300%
        part_ops = rng.randint(1, ops)
        part = rng.uniform(0.2, 0.9) * unprof * part_ops / ops + part_ops * per_op
        randoms.append((part, part_ops, unprof + ops * per_op, ops, unprof))
    for i, args in enumerate(fixed + randoms):
        part, part_ops, prof_ms, ops, unprof = args
        call = (f"corrected_share(part_ms={part:.4g}, part_ops={part_ops}, profiled_ms={prof_ms:.4g}, ops={ops}, "
                f"unprofiled_ms={unprof:.4g}){cases.tag(i >= len(fixed))}")
        got = as_number(learner_call(fn, args, call, (capstone.corrected_share,), expected="a fraction",
                                     library=True), call)
        per = (prof_ms - unprof) / ops
        raw = _raw_share(*args)
        expected = min(max(raw, 0.0), 1.0)
        clip = lambda v: min(max(v, 0.0), 1.0)
        whole = "the step's whole overhead (profiled_ms - unprofiled_ms) taken off the part: take off only its own " \
                "operators' share, part_ops x (profiled_ms - unprofiled_ms) / ops"
        if not 0 <= raw <= 1 and near(got, raw, 1e-6):  # which end is missing: ask the other end's case
            other = fixed[3] if raw > 1 else fixed[4]
            probe = as_number(learner_call(fn, other, call, (capstone.corrected_share,), library=True), call)
            if near(probe, min(max(_raw_share(*other), 0.0), 1.0), 1e-6):
                fail(f"{call} returned {got:.6g}: clipped at {'0' if raw > 1 else '1'} only -- clip to [0, 1]: a "
                     f"share {'above 1' if raw > 1 else 'below 0'} is as impossible as one "
                     f"{'below 0' if raw > 1 else 'above 1'} (expected {expected:.6g})")
        time = "the part's corrected TIME in ms: divide it by unprofiled_ms for its share of the step"
        wrong = [(("not clipped: a share lies in [0, 1] -- the per-op overhead is an average, so a part of cheap "
                   "operators can correct below 0 (or one measured in another round above 1): clip to [0, 1]"), raw),
                 (time, part - part_ops * per), (time, unprof * expected),
                 (whole, (part - (prof_ms - unprof)) / unprof), (whole, clip((part - (prof_ms - unprof)) / unprof)),
                 ("the raw profile share part_ms / profiled_ms: it still carries the profiler's overhead",
                  part / prof_ms),
                 (("part_ms / unprofiled_ms: the part's time is still the profiled one -- subtract its operators' "
                   "overhead, part_ops x (profiled_ms - unprofiled_ms) / ops"), part / unprof),
                 ("the corrected time over the PROFILED step: divide by the unprofiled step",
                  (part - part_ops * per) / prof_ms),
                 (("the overhead per op taken as profiled_ms / ops: only the difference, (profiled - unprofiled) / "
                   "ops, is the profiler's"), (part - part_ops * prof_ms / ops) / unprof),
                 ("a percentage: return a fraction", 100 * expected)]
        if not near(got, expected, 1e-6):
            for why, value in wrong:
                if near(got, value, 1e-6) and not near(value, expected, 1e-6):
                    fail(f"{call} returned {got:.6g}, {why} (expected {expected:.6g})")
        expect_number(got, expected, call, rtol=1e-6, atol=1e-12)
    return "per-op overhead from the step, taken out of the part, over the unprofiled step"


# ---------------------------------------------------------------------------------------------- 12.6
@checker("12.6", "driving torch.profiler: schedule, shapes, stacks, activities, trace",
         in_kernel="it reads the torch.profiler object the learner returns (its activities, shapes, stacks)")
@replayable
def check_profile_steps(fn, cases):
    """fn(step, trace_path, wait, warmup, active, device) -> the finished torch.profiler.profile: a schedule of
    `wait` skipped, `warmup` warm-up and `active` recorded steps, record_shapes and with_stack on, CPU activity
    (and CUDA when device == "cuda"), the Chrome trace written to trace_path."""
    import tempfile
    import warnings
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile, record_function

    from common.core.measurement import native_stderr_captured
    a = torch.randn(48, 48, generator=cases.gen)
    shapes = [(1, 1, 2), (1, 2, 3), (2, 1, 1)]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (wait, warmup, active) in enumerate(shapes + [(1, 1, 1)]):
            device = "cuda" if i == len(shapes) else "cpu"
            calls = []

            def step():
                cold = len(calls) < wait + warmup
                calls.append(cold)
                with record_function("checker: skipped or warm-up step" if cold else "checker: recorded step"):
                    (a @ a).sum()

            path = Path(tmp) / f"trace_{i}.json"
            call = f"profile_steps(step, trace_path, wait={wait}, warmup={warmup}, active={active}, device={device!r})"
            try:
                with warnings.catch_warnings(), native_stderr_captured():
                    warnings.simplefilter("ignore")  # device="cuda" on a machine without one: torch warns
                    prof = learner_call(fn, (step, str(path), wait, warmup, active, device), call, library=True)
            except CheckFailed as exc:
                if "must be initialized" in str(exc.__cause__ or ""):
                    fail(f"{call}: torch says {str(exc.__cause__)!r} -- nothing was recorded: with a schedule, the "
                         f"profiler only moves from step to step when you call prof.step() after each step(), so "
                         f"it never reached the active steps")
                raise
            if type(prof).__module__.startswith("torch.autograd"):
                fail(f"{call} returned {type(prof).__module__}.{type(prof).__name__}, the legacy autograd profiler "
                     f"(no schedule, no activities); use torch.profiler.profile")
            expect(isinstance(prof, profile), f"{call} returned {type(prof).__name__}; return the "
                                              f"torch.profiler.profile object (after its `with` block)")
            expect(len(calls) == wait + warmup + active,
                   f"{call} ran the step {len(calls)} times; a schedule of wait={wait}, warmup={warmup}, "
                   f"active={active} needs {wait + warmup + active} steps, each followed by prof.step()")
            profile_checks.check_schedule(call, prof, wait, warmup, active)
            want = {ProfilerActivity.CPU} | ({ProfilerActivity.CUDA} if device == "cuda" else set())
            got = set(prof.activities)
            if device == "cuda":
                expect(ProfilerActivity.CUDA in got, f"{call}: activities {sorted(act.name for act in got)}; on a GPU "
                                                     f"run add ProfilerActivity.CUDA, or the kernels are missing")
            expect(got == want, f"{call}: activities {sorted(act.name for act in got)}, expected "
                                f"{sorted(act.name for act in want)} (CUDA only on a GPU run)")
            expect(prof.record_shapes, f"{call}: record_shapes is off; turn it on to see each operator's shapes")
            expect(prof.with_stack, f"{call}: with_stack is off; turn it on to see where each operator was called")
            names = profile_checks.profiled_names(prof, path)
            if "checker: skipped or warm-up step" in names:
                fail(f"{call}: the trace holds a skipped or warm-up step -- no schedule, or warmup=0: use "
                     f"torch.profiler.schedule(wait={wait}, warmup={warmup}, active={active}) so the first steps "
                     f"(cold caches, the profiler starting) are not recorded")
            recorded = names.count("checker: recorded step")
            expect(recorded == active, f"{call}: the trace holds {recorded} recorded steps, expected active={active}")
    return "schedule honoured (no warm-up step recorded), shapes, stacks, CPU/CUDA activities, trace written"


# ---------------------------------------------------------------------------------------------- 12.7
@checker("12.7", "the top operator by self time, and its shapes")
@replayable
def check_top_op(fn, cases):
    """fn(averages, device) -> (name, input_shapes, self_us): the aten operator with the largest self time (device
    time on a GPU run) in prof.key_averages(group_by_input_shape=True)."""
    r = cases.rng.uniform(1.0, 2.0)
    # every look-alike ranking picks a different row: total, smallest, per call, ranges and frames, the CPU time of a
    # GPU operator (its launch), its device total (its children's kernels)
    cpu = [profile_checks.row("routed_experts", 1100 * r, 5000 * r), profile_checks.row("aten::linear", 20, 3000 * r, shapes=[(64, 32), (32, 8)]),
           profile_checks.row("aten::addmm", 400 * r, 420 * r, shapes=[(8,), (64, 32), (32, 8)], count=50),
           profile_checks.row("aten::addmm", 300, 310, shapes=[(8,), (16, 32), (32, 8)]), profile_checks.row("aten::add_", 250, 250, count=40),
           profile_checks.row("aten::_softmax", 350 * r, 350 * r, shapes=[(64, 8), ()]), profile_checks.row("aten::view", 2, 2, shapes=[(64, 32)]),
           profile_checks.row("torch/nn/modules/module.py(1750): _call_impl", 1200 * r, 6000 * r)]
    gpu = [profile_checks.row("aten::bmm", 40, 60, 900 * r, 900 * r, [(8, 64, 32), (8, 32, 16)], count=20),
           profile_checks.row("aten::index_select", 500 * r, 520 * r, 30, 30, [(4096, 64), (), (512,)]),
           profile_checks.row("aten::mm", 60, 80, 400, 400, [(64, 32), (32, 16)]),
           profile_checks.row("aten::linear", 15, 200, 0, 1500 * r, [(64, 32), (16, 32), (16,)])]
    why = {"routed_experts": "a record_function range, not an operator: take aten:: entries only",
           "torch/nn/modules/module.py(1750): _call_impl": "a Python frame (with_stack records them): take aten:: "
                                                           "entries only"}
    for rows, device, want in ((cpu, "cpu", cpu[2]), (gpu, "cuda", gpu[0])):
        rows = list(rows)
        cases.rng.shuffle(rows)
        key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
        aten = [a for a in rows if a.key.startswith("aten::")]
        def top(by, pick=max, aten=aten):
            return pick(aten, key=by).key
        self_time = lambda a, key=key: getattr(a, key)
        looks = [(top(lambda a: a.cpu_time_total), ("the top by TOTAL time (cpu_time_total), which includes the "
                                                    "operators it calls; rank by self time (self_cpu_time_total)")),
                 (top(self_time, min), ("the SMALLEST self time (min where max is asked): the top operator has "
                                        "the largest")),
                 (top(lambda a, t=self_time: t(a) / a.count), ("the top by self time PER CALL: an operator called many "
                                                          "times costs its total self time, not one call's"))]
        if device == "cuda":
            looks = [(top(lambda a: a.device_time_total), ("the top by total device time (device_time_total), which "
                                                           "counts the kernels of the operators it calls; rank by "
                                                           "self_device_time_total")),
                     (top(lambda a: a.self_cpu_time_total), ("the top by CPU time on a GPU run: the CPU time of a GPU "
                                                             "operator is its launch; rank by "
                                                             "self_device_time_total")),
                     *looks[1:]]
        call = f"top_op(<{len(rows)} averages>, device={device!r}) [random case, seed {cases.seed}]"
        got = learner_call(fn, (rows, device), call, expected="(name, input_shapes, self_us)", library=True)
        expect(isinstance(got, tuple) and len(got) == 3, f"{call} returned {got!r:.80}; return a tuple (name, "
                                                         f"input_shapes, self time in us)")
        name, shapes, self_us = got
        if device == "cpu" and isinstance(self_us, (int, float)) and self_us == 0:
            fail(f"{call}: self time 0 on a CPU run -- without a GPU there is no device time; rank and report by "
                 f"self_cpu_time_total when device is 'cpu'")
        if name != want.key and name in why:
            fail(f"{call} returned {name!r}, {why[name]}")
        for alt, words in looks:
            if name == alt != want.key:
                fail(f"{call} returned {name!r}, {words} ({want.key!r} here)")
        expect(name == want.key, f"{call} returned {name!r}; the top operator by self time is {want.key!r}")
        expect(list(map(list, shapes)) == want.input_shapes, f"{call}: the shapes {shapes!r} are another entry's "
               f"(group_by_input_shape keeps one row per shape); the top row has {want.input_shapes}")
        expected_us = want.self_device_time_total if device == "cuda" else want.self_cpu_time_total
        if near(as_number(self_us, call), expected_us / 1e3, 1e-9):
            fail(f"{call}: self time {self_us:.6g}, in milliseconds; the averages are in microseconds -- return "
                 f"{expected_us:.6g}")
        expect_number(as_number(self_us, call), expected_us, f"self time returned by {call}", rtol=1e-9)
    return "aten operators only, by self time (device time on a GPU run), with that row's shapes"


# ---------------------------------------------------------------------------------------------- 12.4
@checker("12.4", "the paired guard: keep, revert or undecided")
@replayable
def check_keep_or_revert(fn, cases):
    """fn(current, candidate, bar, pairs, max_pairs, rng, clock, sync) -> (decision, ratios): each step warmed up once,
    then pairs in random order, each run timed alone (clock, step, sync, clock), ratio t_current / t_candidate per
    pair; after each batch of `pairs`, keep / revert when the 90% interval of the median ratio lies wholly above /
    below 1 + bar; 'undecided' when another batch would pass max_pairs."""
    import random
    firsts = []
    for i, (name, bar, pairs, max_pairs, ratios) in enumerate(guard_checks.CASES):
        current, candidate = guard_checks.series(0.01 * (1 + 0.1 * i), ratios[:max_pairs])
        dev = guard_checks.Device(current, candidate)
        call = guard_checks.call(name, bar, pairs, max_pairs)
        got = learner_call(fn, (dev.step("current"), dev.step("candidate"), bar, pairs, max_pairs,
                                random.Random(cases.seed + i), dev.clock, dev.sync), call,
                           (capstone.keep_or_revert,), expected="(decision, ratios)", library=True,
                           allowed=("common.systems.capstone.guard.median_interval",))
        expect(isinstance(got, (tuple, list)) and len(got) == 2, f"{call} returned {got!r:.80}; return a pair "
                                                                  f"(decision, ratios)")
        decision, ratios_got = got
        try:
            ratios_got = [float(r) for r in ratios_got]
        except (TypeError, ValueError):
            fail(f"{call}: the ratios {ratios_got!r:.80} are not a list of numbers")
        expect(len(ratios_got) >= 2, f"{call}: {len(ratios_got)} ratio(s); a verdict needs the pairs' ratios")
        expect(dev.unsynced_reads == 0, f"{call}: you read the clock {dev.unsynced_reads} time(s) while a step's "
                                        f"work was still queued on the device: the time was the launch, not the "
                                        f"work -- call sync() after each step (and after the warm-up) before "
                                        f"reading the clock")
        guard_checks.check_ratios(call, dev, ratios_got, firsts)
        guard_checks.check_decision(call, decision, ratios_got, bar, pairs, max_pairs)
    expect(len(set(firsts)) > 1, f"every pair ran {firsts[0]!r} first ({len(firsts)} pairs): a machine that warms "
                                 f"up or slows down within a pair biases every ratio the same way -- draw each "
                                 f"pair's order at random (rng.sample or rng.shuffle)")
    return f"warm-up, random order, synchronised times, the call on the 90% interval ({len(firsts)} pairs in 6 cases)"

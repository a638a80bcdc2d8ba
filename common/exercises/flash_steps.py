"""Lab 04's Triton FlashAttention forward, built in four graded steps (in the spirit of Triton-Puzzles): one query
tile against one key block (4.4), the loop over key blocks with the online softmax (4.5), ragged ends (4.6), causal
(4.7). Each step is a kernel of the signature of `attention.launch_forward`, checked against SDPA on the cases of its
step, with the blocks the checker chooses.

A wrong kernel is named by its mistake: `fwd_variant` computes, in float64, what a kernel with one named mistake
computes -- reading K and V rows past N_CTX from the buffer the inputs live in, as an unmasked kernel does -- and
the first variant that the learner's output matches (NaN where it is NaN, close elsewhere) gives the verdict.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from common.core.checks import CheckFailed, expect, fail
from common.exercises.attention_checks import TOL, random_inputs, rel_err
from common.exercises.cases import COMMON, learner_call, record_launches, unmasked_accesses

LOG2E = 1.4426950408889634

# mistake -> what the verdict says; the step a mistake first becomes possible in is in STEPS
MISTAKES = {
    # the scale (every step)
    "no_scale": "the scores are not scaled: S = Q K^T * sm_scale, with sm_scale = 1/sqrt(d) passed to the kernel",
    "scale_twice": "the scores are scaled twice (sm_scale squared): multiply Q K^T by sm_scale once",
    "exp2_no_log2e": "tl.math.exp2 on scores scaled by sm_scale alone: sm_scale does not include log2(e), and "
                     "exp2(x) = exp(x ln 2) -- multiply the scale by log2(e) = 1.4426950408889634 (or use tl.exp)",
    "exp_with_log2e": "log2(e) folded into the scale but tl.exp used: with qk_scale = sm_scale * log2(e) the "
                      "exponential must be tl.math.exp2 (or drop log2(e) and use tl.exp)",
    # one tile against one block (4.4)
    "no_normalize": "the output is not divided by the row sum l: O = (P V) / l, P = exp(S - max) unnormalised",
    "wrong_axis": "the max and the sum run over axis 0 (the query rows, per key): a softmax is over the keys of each "
                  "query row -- tl.max(qk, 1), tl.sum(p, 1)",
    "k_not_transposed": "K is loaded as a (BLOCK_N, HEAD_DIM) block and multiplied as is: S = Q K^T needs K^T -- load "
                        "it with offs_n[None, :] * HEAD_DIM + offs_d[:, None] (a (HEAD_DIM, BLOCK_N) block)",
    "keys_block_m": "the key block holds BLOCK_M keys: BLOCK_M counts query rows, BLOCK_N keys -- the key offsets "
                    "are tl.arange(0, BLOCK_N)",
    # the loop (4.5)
    "one_block_only": "only the first BLOCK_N keys are used: loop over every key block, "
                      "for start_n in range(0, N_CTX, BLOCK_N)",
    "loop_step_bm": "the key loop advances by BLOCK_M: each step loads BLOCK_N keys, so it must advance by BLOCK_N",
    "no_rescale": "when a block raises the running max, the sum and the accumulator are not rescaled: multiply both by "
                  "alpha = exp(m_old - m_new) before adding the new block",
    "rescale_l_only": "the sum l is rescaled when the max grows, but the accumulator is not: acc = acc * alpha + P V",
    "rescale_acc_only": "the accumulator is rescaled when the max grows, but the sum l is not: "
                        "l = l * alpha + rowsum(P)",
    "alpha_inverted": "every output is NaN: alpha is exp(m_new - m_old), which is exp(+inf) on the first block "
                      "(m_old = -inf) -- alpha = exp(m_old - m_new), at most 1",
    # ragged ends (4.6)
    "no_key_mask": "keys past N_CTX are used: the last key block runs past the end (into the next head's keys) -- "
                   "mask the K and V loads with cols < N_CTX and set those scores to -inf",
    "scores_not_masked": "keys past N_CTX are loaded as 0 but their scores are left at 0, which still adds exp(0 - m) "
                         "to the sum: set them to -inf (tl.where(cols[None, :] < N_CTX, qk, float('-inf')))",
    "v_unmasked": "V is loaded without a mask: its rows past N_CTX are another head's (or NaN after the last one), "
                  "and 0 x NaN is NaN -- mask the V load too (other=0)",
    "key_mask_off_by_one": "the key mask is off by one: cols <= N_CTX lets key N_CTX in -- keys run 0 .. N_CTX - 1, "
                           "mask with cols < N_CTX",
    # causal (4.7)
    "causal_ignored": "CAUSAL is ignored: with CAUSAL true, query i may see keys j <= i only",
    "causal_reversed": "the causal mask points the wrong way: query i may see keys j <= i (offs_m[:, None] >= "
                       "cols[None, :]), not j >= i",
    "causal_no_diagonal": "the causal mask is off by one: the diagonal is masked too -- query i must see key i (keep "
                          "j <= i, not j < i)",
    "causal_plus_one": "the causal mask is off by one: query i also sees key i + 1 -- keep j <= i",
    "causal_local_index": "the causal mask compares positions inside the tiles (tl.arange alone): compare absolute "
                          "positions, offs_m[:, None] >= (start_n + offs_n)[None, :]",
    "causal_bound_bn": "the causal key loop stops at (start_m + 1) * BLOCK_N: the last key a query block needs is its "
                       "last row, so stop at min((start_m + 1) * BLOCK_M, N_CTX)",
    "causal_bound_before_diagonal": "the causal key loop stops before the diagonal block (start_m * BLOCK_M): the "
                                    "block on the diagonal holds each row's own key -- stop at "
                                    "min((start_m + 1) * BLOCK_M, N_CTX)",
    "causal_no_mask": "the causal loop stops at the diagonal block but nothing is masked inside it: keys j > i of "
                      "that block must get score -inf",
}


@dataclass(frozen=True)
class Step:
    title: str
    cases: tuple  # (B, H, N, d, causal, large scores, BLOCK_M, BLOCK_N)
    mistakes: tuple  # the names tried, in order
    masks: bool  # every tl.load / tl.store must carry a mask (4.6; a tuned kernel may skip them on full blocks)


_SCALE = ("exp2_no_log2e", "no_scale", "scale_twice", "exp_with_log2e")
_ONE = ("no_normalize", "wrong_axis", "k_not_transposed", "keys_block_m")
_LOOP = ("one_block_only", "loop_step_bm", "no_rescale", "rescale_l_only", "rescale_acc_only")
_RAGGED = ("no_key_mask", "scores_not_masked", "v_unmasked", "key_mask_off_by_one")
_CAUSAL = ("causal_ignored", "causal_reversed", "causal_no_diagonal", "causal_plus_one", "causal_local_index",
           "causal_bound_bn", "causal_bound_before_diagonal", "causal_no_mask")

STEPS = {
    "4.4": Step("one query tile against one key block",
                ((1, 2, 64, 64, False, False, 64, 64), (1, 1, 64, 32, False, False, 32, 64),
                 (1, 1, 64, 32, False, True, 64, 64)),
                _SCALE + _ONE, masks=False),
    "4.5": Step("the key loop with the online softmax",
                ((1, 2, 128, 32, False, False, 64, 32), (1, 1, 128, 32, False, True, 64, 32)),
                _SCALE + _LOOP + _ONE + ("alpha_inverted",), masks=False),
    "4.6": Step("ragged ends: any sequence length",
                ((1, 3, None, 32, False, False, 64, 32), (1, 1, "short", 32, False, False, 64, 32),
                 (1, 1, None, 32, False, True, 64, 32)),
                _SCALE + _RAGGED + _LOOP + ("alpha_inverted",), masks=True),
    "4.7": Step("causal: the full kernel",
                ((1, 2, 128, 32, True, False, 64, 32), (1, 2, None, 32, True, False, 64, 32),
                 (1, 1, None, 32, False, False, 64, 32), (1, 1, "short", 64, True, False, 64, 32)),
                _SCALE + _CAUSAL + _RAGGED + _LOOP + ("alpha_inverted",), masks=False),
}


# ----------------------------------------------------------------------------------------------------------------------
# what a kernel with one named mistake computes

def fwd_variant(q, k, v, causal: bool, scale: float, block_m: int, block_n: int, mistake: str | None = None):
    """The kernel's output in float64 (NaN where it writes nothing), right (`mistake` None) or with one mistake of
    MISTAKES; None where the mistake cannot run with these blocks. K and V rows past N_CTX are read, where the
    mistake reads them, from the flat buffer behind the inputs: the next head's rows, NaN after the last head (the
    checker pads its inputs with NaN). All heads and query tiles at once, one key block after another."""
    import torch
    f64 = torch.float64
    b, h, n, d = q.shape
    bh, tiles = b * h, -(-n // block_m)
    kb = block_m if mistake == "keys_block_m" else block_n  # keys per step
    if (mistake == "k_not_transposed" and d != kb) or (mistake == "wrong_axis" and block_m != kb):
        return None
    q64, k64, v64 = (t.detach().to("cpu", f64).reshape(bh, n, d) for t in (q, k, v))
    pad = torch.full((4 * max(block_m, block_n) + n, d), float("nan"), dtype=f64)
    kf, vf = torch.cat([k64.reshape(-1, d), pad]), torch.cat([v64.reshape(-1, d), pad])
    qp = torch.zeros(bh, tiles * block_m, d, dtype=f64)
    qp[:, :n] = q64
    qp = qp.view(bh, tiles, block_m, d)
    rows = torch.arange(tiles * block_m).view(tiles, block_m)
    start = rows[:, 0]
    s_eff = {"no_scale": 1.0, "scale_twice": scale * scale, "exp2_no_log2e": scale / LOG2E,
             "exp_with_log2e": scale * LOG2E}.get(mistake, scale)
    is_causal = causal and mistake != "causal_ignored"
    if mistake in ("one_block_only", "keys_block_m"):
        hi = torch.full((tiles,), min(n, kb))
    elif is_causal:
        hi = {"causal_bound_bn": (start // block_m + 1) * block_n,
              "causal_bound_before_diagonal": start}.get(mistake, start + block_m).clamp(max=n)
    else:
        hi = torch.full((tiles,), n)
    step = block_m if mistake == "loop_step_bm" else kb
    m = torch.full((bh, tiles, block_m), -math.inf, dtype=f64)
    l = torch.zeros(bh, tiles, block_m, dtype=f64)
    acc = torch.zeros(bh, tiles, block_m, d, dtype=f64)
    zero = torch.zeros((), dtype=f64)
    unmasked_k = mistake in ("no_key_mask", "key_mask_off_by_one")
    unmasked_v = unmasked_k or mistake == "v_unmasked"
    for s0 in range(0, int(hi.max()), step):
        active = (s0 < hi)[None, :, None]
        cols = torch.arange(s0, s0 + kb)
        inside = cols <= n if mistake == "key_mask_off_by_one" else cols < n
        flat = torch.arange(bh)[:, None] * n + cols[None, :]
        kj = torch.where((inside | unmasked_k)[None, :, None], kf[flat], zero)  # (bh, kb, d)
        vj = torch.where((inside | unmasked_v)[None, :, None], vf[flat], zero)
        if mistake == "k_not_transposed":
            sc = torch.einsum("btmc,bcj->btmj", qp, kj) * s_eff
        else:
            sc = torch.einsum("btmc,bjc->btmj", qp, kj) * s_eff
        keep = torch.ones(tiles, block_m, kb, dtype=torch.bool)
        if mistake != "no_key_mask":
            keep &= inside[None, None, :]
        if is_causal and mistake != "causal_no_mask":
            r, c = rows[:, :, None], cols[None, None, :]
            keep &= {"causal_reversed": r <= c, "causal_no_diagonal": r > c, "causal_plus_one": r + 1 >= c,
                     "causal_local_index": (r - start[:, None, None]) >= (c - s0)}.get(mistake, r >= c)
        keep = keep.expand(bh, tiles, block_m, kb)
        sc = torch.where(keep, sc, zero) if mistake == "scores_not_masked" else sc.masked_fill(~keep, -math.inf)
        if mistake == "wrong_axis":
            p = torch.exp(sc - sc.amax(2, keepdim=True))
            new_acc, new_l = torch.einsum("btmj,bjc->btmc", p, vj), p.sum(2)
            acc, l = torch.where(active[..., None], new_acc, acc), torch.where(active, new_l, l)
            continue
        m_new = torch.maximum(m, sc.amax(-1))
        p = torch.exp(sc - m_new[..., None])
        alpha = torch.exp(m_new - m) if mistake == "alpha_inverted" else torch.exp(m - m_new)
        if mistake == "no_rescale":
            alpha = torch.ones_like(alpha)
        new_l = (l if mistake == "rescale_acc_only" else l * alpha) + p.sum(-1)
        new_acc = (acc if mistake == "rescale_l_only" else acc * alpha[..., None]) + torch.einsum(
            "btmj,bjc->btmc", p, vj)
        m, l, acc = (torch.where(active, m_new, m), torch.where(active, new_l, l),
                     torch.where(active[..., None], new_acc, acc))
    o = acc if mistake == "no_normalize" else acc / l[..., None]
    return o.reshape(bh, tiles * block_m, d)[:, :n].reshape(b, h, n, d)


def same_output(got, expected, tol: float) -> bool:
    """NaN in the same places, and close (relative to the largest finite value) everywhere else."""
    import torch
    if expected is None:
        return False
    g = got.detach().to("cpu", torch.float64)
    if g.shape != expected.shape:
        return False
    nan_g, nan_e = ~torch.isfinite(g), ~torch.isfinite(expected)
    if not torch.equal(nan_g, nan_e):
        return False
    if nan_e.all():
        return True
    scale = expected[~nan_e].abs().max().item() or 1.0
    return (g[~nan_g] - expected[~nan_e]).abs().max().item() / scale < tol


def never_written(got, ref, block_m: int) -> str | None:
    """Which part of O the kernel never wrote (NaN exactly there, right elsewhere): every (batch, head) after the
    first, or every query tile after the first -- the program's (batch, head) or query-tile offset is missing."""
    import torch
    g = got.detach().to("cpu", torch.float64)
    b, h, n, d = g.shape
    g, r = g.reshape(b * h, n, d), ref.reshape(b * h, n, d)
    nan = ~torch.isfinite(g)
    if b * h > 1 and nan[1:].all() and rel_err(g[0], r[0]) < 1e-3:
        return ("O of every (batch, head) after the first was never written: offset Q, K, V and O by the program's "
                "(batch, head), base = tl.program_id(1) * N_CTX * HEAD_DIM")
    if n > block_m and nan[:, block_m:].all() and rel_err(g[:, :block_m], r[:, :block_m]) < 1e-3:
        return (f"rows {block_m} and after (every query tile after the first) were never written: each program "
                f"handles its own tile -- offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)")
    return None


# ----------------------------------------------------------------------------------------------------------------------
# the check of one step

@contextlib.contextmanager
def blocks(block_m: int, block_n: int):
    """Every launch inside without explicit blocks uses BLOCK_M x BLOCK_N (`attention.launch_forward`)."""
    from common.kernels.attention import triton_forward
    saved = triton_forward.BLOCKS
    triton_forward.BLOCKS = (block_m, block_n)
    try:
        yield
    finally:
        triton_forward.BLOCKS = saved


def _lengths(n, bm, bn, rng):
    if n is None:  # ragged: a multiple of neither block, more than one query tile
        return rng.choice([x for x in range(bm + 2, 2 * bm) if x % bn])
    if n == "short":  # shorter than one query block
        return rng.randint(20, bm - 1)
    return n


def check_step(exercise: str, flash_forward, cases, references=()) -> str:
    """Run the learner's `flash_forward(q, k, v, causal)` (its kernel launched by `attention.launch_forward`) on the
    cases of step `exercise`; name the first mistake that explains a wrong output."""
    import torch

    from common.kernels.attention import reference_attention
    step = STEPS[exercise]
    seed, rng = cases.seed, cases.rng
    gpu = torch.cuda.is_available()
    device, dtypes = ("cuda", (torch.bfloat16, torch.float16)) if gpu else ("cpu", (torch.float32,))
    gen = torch.Generator().manual_seed(seed)
    launched = []
    count = 0
    for dtype in dtypes:
        tol = TOL[str(dtype).replace("torch.", "")]
        for b, h, n, d, causal, large, bm, bn in step.cases:
            n = _lengths(n, bm, bn, rng)
            q, k, v = random_inputs(b, h, n, d, dtype, device, scale=30.0 if large else 1.0, gen=gen)
            where = (f"B={b}, H={h}, N={n}, d={d}, {'causal' if causal else 'non-causal'}, BLOCK_M={bm}, "
                     f"BLOCK_N={bn}, {str(dtype).replace('torch.', '')}" + (", large scores" if large else "")
                     + f" (seed {seed})")
            copies = [t.clone() for t in (q, k, v)]
            with blocks(bm, bn), record_launches() as launches, dots_counted() as dots:
                try:
                    got = learner_call(flash_forward, (q, k, v, causal), f"your kernel for {where}", references,
                                       allowed=HANDED, library=True)
                except CheckFailed as exc:
                    if "the reference this exercise" not in str(exc):  # a workbook kernel run by the interpreter
                        _own_kernels_only(launches, where)  # is seen as a call from Triton: name the kernel
                    raise
            launched.extend(launches)
            expect(launches, "the values may be right, but no Triton kernel was launched -- the exercise is the "
                             "kernel: launch it with attention.launch_forward (torch's SDPA or a PyTorch loop is "
                             "not it)")
            _launched_right(launches, got, bm, bn, where)
            skipped = _blocks_skipped(dots, b * h, n, bm, bn) if causal else True
            for name, t, c in zip("qkv", (q, k, v), copies):
                expect(torch.equal(t.nan_to_num(), c.nan_to_num()), f"{where}: your kernel modified its input {name}")
            expect(got is not None and tuple(got.shape) == (b, h, n, d),
                   f"output for {where}: expected shape {(b, h, n, d)}, got "
                   f"{None if got is None else tuple(got.shape)}")
            ref = reference_attention(q, k, v, causal)
            count += 1
            if rel_err(got, ref) < tol:
                if not skipped:
                    fail(f"{where}: the output is right, but the key loop ran over every key block, the ones "
                         f"entirely above the diagonal too (masked to -inf, they add nothing; counted in the "
                         f"interpreter's tl.dot calls): stop it at min((start_m + 1) * BLOCK_M, N_CTX) -- skipped, "
                         f"not masked")
                continue
            hole = never_written(got, ref, bm)
            if hole:
                fail(f"{where}: {hole}")
            _diagnose(step, got, q, k, v, causal, bm, bn, tol, large, where)
            _name_a_swap(exercise, flash_forward, q, k, v, causal, bm, bn, tol, ref, where)
            _fallback(got, ref, tol, where)
        if step.masks and launched:
            unmasked = unmasked_accesses(launched[-1]["kernel"])
            if unmasked:
                fail(f"the outputs are right, but a tl.load or tl.store has no mask ({unmasked[0]}): the last query "
                     f"tile and the last key block run past N_CTX, and on a GPU an unmasked access reads another "
                     f"tensor's memory or faults -- pass mask= (and other=0.0 to loads) to every one")
    names = "/".join(str(d).replace("torch.", "") for d in dtypes)
    return f"{step.title}: matches SDPA ({names}) in {count} cases"


HANDED = ("common.kernels.attention.triton_forward.launch_forward",)  # what the exercise hands the learner


@contextlib.contextmanager
def dots_counted():
    """Count the tl.dot calls of kernels run by Triton's interpreter inside the block (the yielded list holds one
    entry per call); compiled kernels are not counted (the list stays empty)."""
    from common.kernels.attention.launch_configs import _interpreted
    calls: list = []
    if not _interpreted():
        yield calls
        return
    from triton.runtime.interpreter import InterpreterBuilder
    real = InterpreterBuilder.create_dot

    def create_dot(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)
    InterpreterBuilder.create_dot = create_dot
    try:
        yield calls
    finally:
        InterpreterBuilder.create_dot = real


def _blocks_skipped(dots, heads: int, n: int, bm: int, bn: int) -> bool:
    """False when the interpreter's tl.dot count is a whole number of full key loops (every key block for every query
    tile) and not of causal ones (key blocks up to the tile's diagonal): the blocks above it were masked, not
    skipped."""
    tiles = -(-n // bm)
    full = heads * tiles * -(-n // bn)
    causal = heads * sum(-(-min((t + 1) * bm, n) // bn) for t in range(tiles))
    count = len(dots)
    return not (count and full != causal and count % full == 0 and count % causal != 0)


def _own_kernels_only(launches, where):
    for launch in launches:
        fn = getattr(launch["kernel"], "fn", launch["kernel"])
        while hasattr(fn, "fn"):
            fn = fn.fn
        code = getattr(fn, "__code__", None)
        if code is not None and code.co_filename.startswith(COMMON):
            fail(f"{where}: the kernel launched is {fn.__name__} from {code.co_filename[len(COMMON) - 7:]}, the "
                 f"workbook's own kernel, which does this exercise for you -- launch the kernel you wrote")


def _launched_right(launches, got, bm, bn, where):
    """The learner's own kernel ran, with the checker's blocks, and what came back is the O it wrote."""
    import torch
    _own_kernels_only(launches, where)
    for launch in launches:
        constants = launch["constants"]
        if (constants.get("BLOCK_M"), constants.get("BLOCK_N")) not in ((bm, bn), (None, None)):
            fail(f"{where}: your kernel was launched with BLOCK_M={constants.get('BLOCK_M')}, "
                 f"BLOCK_N={constants.get('BLOCK_N')}, not the checker's BLOCK_M={bm}, BLOCK_N={bn} -- call "
                 f"attention.launch_forward(kernel, q, k, v, causal=causal) without block sizes")
    outs = [a[3] for a in (launch["args"] for launch in launches) if len(a) > 3 and isinstance(a[3], torch.Tensor)]
    if isinstance(got, torch.Tensor) and outs and not any(
            got.data_ptr() == o.data_ptr() or (got.shape == o.shape and torch.equal(
                got.detach().nan_to_num(), o.detach().to(got.dtype).nan_to_num())) for o in outs):
        fail(f"{where}: what came back is not the O your kernel wrote -- the output was computed outside the kernel "
             f"(torch's SDPA or a PyTorch loop after the launch): return the tensor attention.launch_forward returns")


def _diagnose(step, got, q, k, v, causal, bm, bn, tol, large, where):
    import torch
    scale = q.shape[-1] ** -0.5
    for mistake in step.mistakes:
        if mistake in _CAUSAL and not causal:
            continue
        if same_output(got, fwd_variant(q, k, v, causal, scale, bm, bn, mistake), tol):
            fail(f"{where}: {MISTAKES[mistake]}")
    if large and not torch.isfinite(got.float()).all():
        fail(f"{where}: inf/NaN in the output with large scores: exp overflowed -- subtract the row's (running) max "
             f"before the exponential")


def _name_a_swap(exercise, flash_forward, q, k, v, causal, bm, bn, tol, ref, where):
    """Wrong with BLOCK_M != BLOCK_N but right with equal blocks: BLOCK_M and BLOCK_N are mixed up somewhere."""
    if exercise == "4.4" or bm == bn:
        return
    try:
        with blocks(bm, bm), contextlib.redirect_stdout(None):
            again = flash_forward(q, k, v, causal)
    except Exception:  # noqa: BLE001 -- any failure of the rerun means it is not a swap
        return
    if rel_err(again, ref) < tol:
        fail(f"{where}: right with BLOCK_M = BLOCK_N = {bm} but wrong with BLOCK_M={bm}, BLOCK_N={bn}: BLOCK_M (the "
             f"query rows of a program) and BLOCK_N (the keys of one step) are swapped somewhere (the offsets, the "
             f"loop step or the causal bound)")


def _fallback(got, ref, tol, where):
    from common.core.checks import expect_close
    err = rel_err(got, ref)
    expect_close(got, ref, f"output for {where} (relative error {err:.2g}, allowed {tol:g})", rtol=tol,
                 atol=tol * float(ref.abs().max()))


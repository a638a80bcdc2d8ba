"""Checkers for lab 04 (FlashAttention tiling): HBM bytes, online softmax, tiled attention, a Triton forward built in
four steps (common.exercises.flash_steps), the tiled backward.

Every check draws fresh random inputs and compares with SDPA in float64 on the CPU. When an answer is wrong, the
checker tries the classic mistakes (no rescale when the max grows, max not subtracted, causal mask reversed or off by
one, a sequence length that is not a multiple of the block) and names the one that explains it.
"""
from __future__ import annotations

from common.core.checks import checker, expect, expect_equal, fail
from common.exercises.attention_checks import TOL, check_attention, full_matrix_guard, rel_err, unskipped
from common.exercises.cases import Streamed, learner_call, replayable
from common.exercises.flash_steps import check_step



# ----------------------------------------------------------------------------------------------------------------------
# 4.1 standard attention's HBM bytes

def _bytes_mistakes(n, d, b):
    """(what a named mistake returns, the verdict) for standard attention's HBM bytes, most specific first."""
    right = b * (4 * n * d + 4 * n * n)
    return [
        (b * (4 * n * d + 2 * n * n), "you counted the N x N matrices S and P once each; each is written to HBM and "
                                      "read back (S: write + read, P: write + read = 4 N^2 elements)"),
        (4 * n * d + 4 * n * n, f"that is a count of elements; multiply by elem_bytes={b}"),
        (b * 4 * n * n, "you left out Q, K, V read and O written (4 N d elements)"),
        (b * 4 * n * d, "that is FlashAttention's traffic (Q, K, V read, O written); standard attention also writes "
                        "the N x N scores S and probabilities P to HBM and reads them back (4 N^2 elements)"),
        (b * (3 * n * d + 4 * n * n), "one of Q, K, V, O is missing -- read three inputs and write one output (4 N d)"),
        (8 * right, "that is in bits: elem_bytes is already bytes per element, do not multiply by 8"),
        (b * (8 * n * d + 4 * n * n), "Q, K, V and O counted twice (read and written): the inputs are only read and O "
                                      "only written (4 N d elements)"),
        (b * 4 * n * d + 4 * 4 * n * n, "S and P counted in 4-byte floats: they are stored in the inputs' dtype, "
                                        "elem_bytes per element like Q, K, V and O"),
        (4 * n * d + b * 4 * n * n, f"elem_bytes={b} multiplies S and P but not Q, K, V and O: every matrix moves "
                                    f"elem_bytes per element"),
        (b * (4 * n * d + 4 * d * d), "the intermediates counted as d x d: S = Q K^T is N x N (N = seq_len)"),
        (4 * n * n * d, "that is the FLOP count of the two matmuls (2 N^2 d each), not bytes"),
        (b * (4 * n * d + 6 * n * n), "S or P counted three times: each N x N matrix is written once and read once"),
    ] + [(right / unit, f"that is in {name}: return bytes") for unit, name in
         ((1024, "KiB"), (2**20, "MiB"), (1e6, "MB"), (1e9, "GB"))]


@checker("4.1", "HBM bytes of standard attention")
@replayable
def check_standard_attention_bytes(standard_bytes, cases):
    """standard_bytes(seq_len, head_dim, elem_bytes) -> HBM bytes of one head of standard attention (Algorithm 0)."""
    from common.kernels import attention
    seed, rng = cases.seed, cases.rng
    # every element size accepted gets a fixed case (asymmetric: N != d, so no two mistakes give one number)
    cases_ = [(1024, 64, 2), (4096, 128, 2), (3000, 80, 4), (777, 32, 1)] + [
        (rng.randint(1, 20000), rng.choice([32, 64, 80, 128, 256]), rng.choice([1, 2, 4])) for _ in range(4)]
    for n, d, b in cases_:
        expected = attention.standard_io_bytes(n, d, b)
        where = f"standard_bytes(seq_len={n}, head_dim={d}, elem_bytes={b}) (seed {seed})"
        got = learner_call(standard_bytes, (n, d, b), where, (attention.standard_io_bytes,
                                                              attention.count_standard_bytes), library=True)
        expect(got is not None, f"{where} returned None -- return the number of bytes")
        for wrong, why in _bytes_mistakes(n, d, b):
            if got == wrong and got != expected:
                fail(f"{where} = {got}: {why}")
        expect_equal(got, expected, where)
    return f"right for {len(cases_)} sizes: elem_bytes * (4 N d + 4 N^2)"


# ----------------------------------------------------------------------------------------------------------------------
# 4.2 online softmax

def _blocks(x, block):
    for j in range(0, x.shape[1], block):
        yield x[:, j:j + block]


def _sum_variant(x64, block, how):
    """l as a one-pass loop with one named mistake computes it: "no_rescale", "inverted" (exp(m_new - m)) or
    "overwritten" (each block's sum replaces l)."""
    import torch
    m = l = None
    for j in range(0, x64.shape[1], block):
        blk = x64[:, j:j + block]
        m_new = blk.amax(-1) if m is None else torch.maximum(m, blk.amax(-1))
        terms = torch.exp(blk - m_new[:, None]).sum(-1)
        if l is None or how == "overwritten":
            l = terms
        else:
            l = l * {"no_rescale": 1.0, "inverted": torch.exp(m_new - m)}.get(how, torch.exp(m - m_new)) + terms
        m = m_new
    return l


_SUM_MISTAKES = {
    "no_rescale": "the sum is too large: when a block raises the max from m to m_new, the sum so far must be rescaled "
                  "by exp(m - m_new) before the new terms are added",
    "inverted": "the rescale factor is inverted: exp(m_new - m) grows the old sum when the max rises -- multiply by "
                "exp(m - m_new), at most 1",
    "overwritten": "l holds only the last block's terms: each block's sum replaced l -- add it to the rescaled sum "
                   "so far, l = l * exp(m - m_new) + sum exp(x - m_new)",
}


@checker("4.2", "online softmax")
@replayable
def check_online_softmax(online_softmax_stats, cases):
    """online_softmax_stats(blocks) -> (m, l): running max and sum of exp(x - m) over an iterable of column blocks."""
    import torch

    from common.core.checks import expect_close
    from common.kernels import attention
    seed, rng, gen = cases.seed, cases.rng, cases.gen
    # small values whose max grows block after block (rows sorted ascending), one block, large values (exp(x)
    # overflows), and the max in the FIRST block (rows sorted descending: a running max that is overwritten by each
    # block's max, not kept, fails there); the blocks come from a one-shot generator
    cases_ = [(rng.randint(2, 6), rng.randint(130, 300), rng.choice([16, 32, 64]), 1.0, True),
              (rng.randint(2, 6), rng.randint(2, 15), 16, 1.0, False),
              (rng.randint(2, 6), rng.randint(100, 300), rng.choice([17, 32, 50]), 40.0, True),
              (rng.randint(2, 6), rng.randint(100, 200), rng.choice([16, 32]), 1.0, "descending")]
    for rows, n, block, scale, ascending in cases_:
        x = torch.randn(rows, n, dtype=torch.float64, generator=gen) * scale
        if ascending:
            x = x.sort(dim=-1, descending=ascending == "descending").values
        x32 = x.float()
        x64 = x32.double()
        m_ref, l_ref = x64.amax(-1), torch.exp(x64 - x64.amax(-1, keepdim=True)).sum(-1)
        where = (f"{rows} rows x {n} columns in blocks of {block}" + (", large values" if scale > 10 else "")
                 + (", the max in the first block" if ascending == "descending" else "") + f" (seed {seed})")
        out = learner_call(online_softmax_stats, (Streamed(_blocks(x32, block)),),
                           f"online_softmax_stats(blocks) for {where}",
                           (attention.online_softmax_stats, attention.online_softmax), library=True)
        expect(isinstance(out, (tuple, list)) and len(out) == 2,
               f"return a pair (m, l) -- the running max and the sum; got {type(out).__name__}")
        low = [t.dtype for t in out if isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16)]
        if low:
            fail(f"for {where} the statistics came back in {str(low[0]).replace('torch.', '')}: work in float32 -- "
                 f"a 16-bit sum of exponentials loses the digits the check needs")
        m, l = (torch.as_tensor(t).double() for t in out)
        expect(m.shape == m_ref.shape and l.shape == l_ref.shape,
               f"m and l need one value per row, shape {tuple(m_ref.shape)}; got {tuple(m.shape)} and "
               f"{tuple(l.shape)}")
        if torch.allclose(m, l_ref, rtol=1e-4) and torch.allclose(l, m_ref, rtol=1e-6):
            fail(f"for {where} the pair came back as (l, m): return (m, l) -- the max first, then the sum")
        if n > block and not (torch.allclose(m, m_ref, rtol=1e-6) and torch.allclose(l, l_ref, rtol=1e-4)):
            kept = torch.cat(list(Streamed(_blocks(x32, block))), dim=1).double()  # what keeping the blocks sees
            m_kept = kept.amax(-1)
            if torch.allclose(m, m_kept, rtol=1e-6) and torch.allclose(
                    l, torch.exp(kept - m_kept[:, None]).sum(-1), rtol=1e-4):
                fail(f"for {where} (m, l) are those of the LAST block repeated: the blocks were kept and combined "
                     f"at the end (a list, torch.cat), but each block arrives in the memory of the previous one, as "
                     f"tiles in SRAM do -- update m and l as each block arrives (that is the online softmax)")
        if ascending == "descending" and not torch.allclose(m, m_ref, rtol=1e-6):
            fail(f"for {where} m is not the row max: keep the running max, m = max(m, block max) -- a later block "
                 f"with smaller values must not replace it")
        if n > block and ascending is True and torch.allclose(m, x64[:, :block].amax(-1), rtol=1e-6) \
                and not torch.allclose(m, m_ref, rtol=1e-6):
            fail(f"for {where} m is the first block's max: update the running max with every block, "
                 f"m = max(m, block max)")
        expect_close(m, m_ref, f"running max m ({where})", rtol=1e-6)
        if not torch.isfinite(l).all():
            fail(f"the sum l is inf/NaN for {where}: exp overflowed -- subtract the running max before exp "
                 f"(exp(x - m), never exp(x))")
        if torch.allclose(l, torch.exp(x64).sum(-1), rtol=1e-4) and not torch.allclose(l, l_ref, rtol=1e-4):
            fail(f"for {where} l equals sum(exp(x)): the max is not subtracted -- keep l = sum exp(x - m) so that "
                 f"large scores do not overflow")
        for look_alike, why in ((torch.log(l_ref), "log(l)"), (m_ref + torch.log(l_ref), "m + log(l)")):
            if torch.allclose(l, look_alike, rtol=1e-4, atol=1e-6):
                fail(f"for {where} l is {why}, the logsumexp: return the sum l = sum exp(x - m) itself")
        if torch.allclose(l, l_ref / n, rtol=1e-4):
            fail(f"for {where} l is the mean of exp(x - m): return the sum, not the sum divided by the columns")
        for how, why in _SUM_MISTAKES.items():
            if n > block and torch.allclose(l, _sum_variant(x64, block, how), rtol=1e-4) \
                    and not torch.allclose(l, l_ref, rtol=1e-4):
                fail(f"for {where} {why}")
        expect_close(l, l_ref, f"the sum l = sum exp(x - m) ({where})", rtol=1e-4)
    return f"running max and rescaled sum right for {len(cases_)} matrices, including growing maxima and exp overflow"


# ----------------------------------------------------------------------------------------------------------------------
# 4.3 tiled attention in PyTorch

@checker("4.3", "tiled attention in PyTorch", in_kernel="it watches the learner's tensor operations (no N x N matrix)")
@replayable
def check_tiled_attention(tiled_attention, cases):
    """tiled_attention(q, k, v, block_m, block_n, causal) -> O, never forming the N x N matrix."""
    import torch

    from common.kernels import attention
    seed, rng = cases.seed, cases.rng
    bm, bn = rng.choice([32, 64]), 16  # block_m > block_n always, and neither equals d = 32 in the first case

    def fn(q, k, v, causal):
        return tiled_attention(q, k, v, bm, bn, causal)

    n_odd = rng.choice([x for x in range(70, 160) if x % 16])
    cases_ = [(1, 2, 4 * 32, 32, False, False), (2, 1, n_odd, 64, False, False),
              (1, 2, 4 * 32, 32, True, False), (1, 1, rng.randint(65, 130), 64, True, False),
              (1, 1, rng.randint(65, 100), 32, False, True)]
    count = check_attention(fn, cases_, torch.float32, "cpu", (bn, 32), "tiled_attention", seed, tiles=(bm, bn),
                             references=(attention.tiled_attention,))
    return f"matches SDPA (float32, relative error < 1e-4) in {count} cases: causal, non-causal, N not a multiple " \
           f"of the blocks, large scores"


# ----------------------------------------------------------------------------------------------------------------------
# 4.4-4.7 the Triton forward, in four steps (common.exercises.flash_steps)

def _flash_references():
    from common.kernels import attention
    return (attention.flash_attention,)


@checker("4.4", "one query tile against one key block (Triton)", in_kernel="it watches the Triton launches")
@replayable
def check_one_block(one_block_forward, cases):
    """one_block_forward(q, k, v, causal) -> O from your kernel; N = BLOCK_N: the whole sequence is one key block."""
    return check_step("4.4", one_block_forward, cases, _flash_references())


@checker("4.5", "the key loop with the online softmax (Triton)", in_kernel="it watches the Triton launches")
@replayable
def check_flash_loop(loop_forward, cases):
    """loop_forward(q, k, v, causal) -> O; N a multiple of both blocks, non-causal."""
    return check_step("4.5", loop_forward, cases, _flash_references())


@checker("4.6", "ragged ends: any sequence length (Triton)",
         in_kernel="it watches the Triton launches and reads the kernel's source")
@replayable
def check_ragged(ragged_forward, cases):
    """ragged_forward(q, k, v, causal) -> O for any N, non-causal; every load and store masked."""
    return check_step("4.6", ragged_forward, cases, _flash_references())


@checker("4.7", "Triton FlashAttention forward, causal (the full kernel)", in_kernel="it watches the Triton launches")
@replayable
def check_triton_forward(flash_forward, cases):
    """flash_forward(q, k, v, causal) -> O from your Triton kernel; float32 on a CPU, bf16 and fp16 on a GPU."""
    return check_step("4.7", flash_forward, cases, _flash_references())


# ----------------------------------------------------------------------------------------------------------------------
# 4.8 the backward pass in PyTorch, tiled

def _bwd_variant(q, k, v, do, causal, scale, bm, bn, mistake=None):
    """Gradients of attention in float64 with full matrices, right or with one named mistake (for the diagnosis)."""
    import torch
    q, k, v, do = (t.detach().double() for t in (q, k, v, do))
    n_q, n_k = q.shape[2], k.shape[2]
    s = (q @ k.transpose(-2, -1)) * scale
    i = torch.arange(n_q)[:, None]
    j = torch.arange(n_k)[None, :]
    keep = torch.ones(n_q, n_k, dtype=torch.bool)
    if causal:
        keep = j <= i
        if mistake == "diagonal":
            keep = j < i
        elif mistake == "tile_mask":  # blocks above the diagonal skipped, but no mask inside the diagonal blocks
            keep = (j // bn) * bn <= (i // bm) * bm + bm - 1
    lse = torch.logsumexp(s.masked_fill(~(j <= i) if causal else torch.zeros_like(keep), float("-inf")), -1)
    if mistake == "no_lse":
        p = torch.exp(s)
    elif mistake == "block_max":  # P = exp(S - the max of its key block) instead of exp(S - L)
        m = torch.cat([s[..., c:c + bn].masked_fill(~keep[:, c:c + bn], float("-inf")).amax(-1, keepdim=True)
                       .expand(*s.shape[:-1], min(bn, n_k - c)) for c in range(0, n_k, bn)], -1)
        p = torch.exp(s - m.nan_to_num(neginf=0.0))
    else:
        p = torch.exp(s - lse[..., None])
    p = p.masked_fill(~keep, 0.0)
    o = torch.softmax(s.masked_fill(~(j <= i) if causal else torch.zeros_like(keep), float("-inf")), -1) @ v
    dv = p.transpose(-2, -1) @ do
    dp = do @ v.transpose(-2, -1)
    delta = do.sum(-1, keepdim=True) if mistake == "delta_do" else (do * o).sum(-1, keepdim=True)
    ds = p * dp if mistake == "no_delta" else p * (dp - delta)
    sc = {"no_scale": 1.0, "scale_twice": scale * scale}.get(mistake, scale)
    return ds @ k * sc, ds.transpose(-2, -1) @ q * (1.0 if mistake == "dk_no_scale" else sc), dv


_BWD_MISTAKES = {
    "no_delta": "dS = P * dP: D = rowsum(dO * O) is missing -- dS = P * (dP - D), the softmax's Jacobian needs it",
    "block_max": "P was recomputed with the max of each key block, not from L: P = exp(S - L) with the forward's "
                 "logsumexp (the block's max gives unnormalised, block-dependent P)",
    "diagonal": "the causal mask drops the diagonal: query i sees key i (keep j <= i, not j < i)",
    "tile_mask": "on the diagonal blocks the causal mask is missing: skipping the blocks above the diagonal is not "
                 "enough, mask key j > query i inside the blocks that cross it",
    "no_scale": "dQ and dK lack the softmax scale: S = Q K^T * scale, so dQ = dS K * scale and dK = dS^T Q * scale",
    "scale_twice": "dQ and dK carry the softmax scale twice (scale^2): S = Q K^T * scale, so dQ = dS K * scale once",
    "dk_no_scale": "dK lacks the softmax scale (dQ has it): dK = dS^T Q * scale",
    "no_lse": "P = exp(S) was recomputed without subtracting L: P = exp(S - L), L the forward's logsumexp per row",
    "delta_do": "D = rowsum(dO), not rowsum(dO * O): D_i = sum_c dO_ic O_ic",
}


@checker("4.8", "tiled attention backward in PyTorch",
         in_kernel="it watches the learner's tensor operations (no N x N matrix, block sizes)")
@replayable
def check_tiled_backward(tiled_backward, cases):
    """tiled_backward(q, k, v, o, lse, do, block_m, block_n, causal) -> (dq, dk, dv), never forming the N x N
    matrix, checked against autograd through SDPA (float64) on float32 inputs."""
    import torch
    import torch.nn.functional as F

    from common.core.checks import expect_close
    from common.kernels import attention
    seed, rng, gen = cases.seed, cases.rng, cases.gen
    tol = TOL["float32"]
    n_odd = rng.choice([x for x in range(70, 140) if x % 32 and x % 16 and x % 48])
    # (B, H, N, d, block_m, block_n, causal): blocks unequal both ways, N not a multiple of either block
    cases_ = [(1, 2, 96, 32, 32, 16, False), (2, 1, n_odd, 16, 16, 32, False), (1, 2, 96, 32, 32, 16, True),
              (1, 1, n_odd, 32, 16, 48, True), (1, 1, rng.randint(40, 90), 16, rng.choice([16, 32]),
                                               rng.choice([8, 16, 24]), rng.random() < 0.5)]
    for b, h, n, d, bm, bn, causal in cases_:
        q, k, v, do = (torch.randn(b, h, n, d, generator=gen) for _ in range(4))
        where = (f"B={b}, H={h}, N={n}, d={d}, block_m={bm}, block_n={bn}, "
                 f"{'causal' if causal else 'non-causal'} (seed {seed})")
        q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
        o64 = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
        o64.backward(do.double())
        scale = d ** -0.5
        s = (q.double() @ k.double().transpose(-2, -1)) * scale
        if causal:
            s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        o, lse = o64.detach().float(), torch.logsumexp(s, -1).float()
        inputs = (q, k, v, o, lse, do)
        copies = [t.clone() for t in inputs]
        guard = full_matrix_guard(n, n, max(bm, bn), record_tiles=d, blocks_of={"q": q, "k": k})
        with guard:
            out = learner_call(tiled_backward, (q, k, v, o, lse, do, bm, bn, causal), f"tiled_backward for {where}",
                               (attention.tiled_attention_backward, attention.flash_attention_backward,
                                attention.tiled_attention, attention.flash_attention, attention.reference_attention),
                               library=True)
        if guard.shortcut:
            fail(f"{where}: {guard.shortcut} -- the exercise is the backward pass by hand: recompute each tile's P "
                 f"from Q, K and lse, then dV += P^T dO, dS = P * (dO V^T - D), dQ += dS K, dK += dS^T Q")
        expect(isinstance(out, (tuple, list)) and len(out) == 3,
               f"tiled_backward(...) for {where} must return a tuple (dq, dk, dv); got {type(out).__name__}"
               + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""))
        for name, t in zip(("q", "k", "v", "o", "lse", "do"), inputs):
            expect(torch.equal(t, copies[("q", "k", "v", "o", "lse", "do").index(name)]),
                   f"{where}: your function modified its input {name} in place -- compute into new tensors")
        if guard.seen:
            fail(f"{where}: {guard.seen[0]} produced a tensor of shape {guard.seen[1]}: the N x N matrix was "
                 f"formed -- work on (block_m x block_n) tiles of S and P only")
        for name, block, other in (("q", bm, "block_m"), ("k", bn, "block_n")):
            if guard.rows.get(name, 0) > block:
                fail(f"{where}: {name} was cut into blocks of {guard.rows[name]} rows, more than {other}={block}"
                     + (" -- are block_m (query rows) and block_n (keys) swapped?" if guard.rows[name] in (bm, bn)
                        else f" -- take blocks of at most {other} rows"))
        got = [torch.as_tensor(t).detach().double() for t in out]
        refs = (q64.grad, k64.grad, v64.grad)
        for g, r, name in zip(got, refs, ("dq", "dk", "dv")):
            expect(tuple(g.shape) == tuple(r.shape), f"{name} for {where}: expected shape {tuple(r.shape)}, got "
                                                     f"{tuple(g.shape)}")
        errs = [rel_err(g, r) for g, r in zip(got, refs)]
        if max(errs) < tol:
            if causal and unskipped(guard, b, h, n, bm, bn):
                fail(f"{where}: the gradients are right, but every (key block, query block) tile was computed, the "
                     f"ones entirely above the diagonal too (P is 0 there): skip the query blocks that end before "
                     f"the key block starts -- start the query loop at (j // block_m) * block_m")
            continue
        for mistake, message in _BWD_MISTAKES.items():
            if mistake in ("diagonal", "tile_mask") and not causal:
                continue
            wrong = _bwd_variant(q, k, v, do, causal, scale, bm, bn, mistake)
            if all(rel_err(g, w) < tol for g, w in zip(got, wrong)):
                fail(f"{where}: {message}")
        for g, r, name, e in zip(got, refs, ("dq", "dk", "dv"), errs):
            if e >= tol:
                expect_close(g, r, f"{name} for {where} (relative error {e:.3g}, allowed {tol:g})", rtol=tol,
                             atol=tol * float(r.abs().max()))
    return (f"dQ, dK, dV match autograd through SDPA in {len(cases_)} cases (causal and not, block_m != block_n, N not "
            f"a multiple of either block), never forming the N x N matrix, inputs untouched")

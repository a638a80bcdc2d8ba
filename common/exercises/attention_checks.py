"""What lab 04's attention checkers share: the float64 SDPA reference and its masked variants, the diagnosis that
names a classic mistake (no rescale, no max, a causal mask reversed or off by one, N not a multiple of the block),
inputs padded with NaN, and a TorchFunctionMode guard that watches the learner's tensor operations (an N x N matrix,
tile shapes, the block sizes really used, SDPA or autograd doing the work)."""
from __future__ import annotations

import contextlib
import math

from common.core.checks import expect, fail
from common.exercises.cases import learner_call

# relative error allowed (max abs error / max abs reference): float32 on the CPU, 16-bit floats on a GPU
TOL = {"float32": 1e-4, "float64": 1e-10, "bfloat16": 3e-2, "float16": 1e-2}


# ----------------------------------------------------------------------------------------------------------------------
# attention helpers

def rel_err(got, ref) -> float:
    import torch
    g, r = got.detach().to("cpu", torch.float64), ref.to(torch.float64)
    if g.shape != r.shape:
        return float("inf")
    finite = torch.isfinite(r)
    if not torch.isfinite(g[finite]).all():
        return float("inf")
    scale = r[finite].abs().max().item() or 1.0
    return (g[finite] - r[finite]).abs().max().item() / scale


def masked_reference(q, k, v, keep, scale=None):
    import torch
    import torch.nn.functional as F
    q64, k64, v64 = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    return F.scaled_dot_product_attention(q64, k64, v64, attn_mask=keep, scale=scale)


def scale_and_mask_variants(q, causal):
    """(message, keep, scale) for the look-alikes of a right output: the scale left out or applied twice, and the
    causal mask ignored."""
    import torch
    n, d = q.shape[2], q.shape[3]
    keep = torch.ones(n, n, dtype=torch.bool).tril() if causal else None
    out = [("the scores are not scaled: S = Q K^T / sqrt(d) (the softmax scale 1/sqrt(d) is missing)", keep, 1.0),
           ("the scores are scaled twice (by 1/d): divide Q K^T by sqrt(d) once", keep, 1.0 / d)]
    if causal:
        out.append(("causal is ignored: with causal=True query i may see keys j <= i only (mask the others with "
                    "-inf)", None, None))
    return out


def causal_variants(n):
    import torch
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    return [("the causal mask points the wrong way: query i may see keys j <= i (the lower triangle, future keys "
             "masked), not j >= i", j >= i),
            ("the causal mask is off by one: the diagonal is masked too -- query i must see key i (keep j <= i, "
             "not j < i)", j < i),
            ("the causal mask is off by one: query i also sees key i + 1 -- keep j <= i", j <= i + 1)]


def diagnose(fn, case, got, tol, make_inputs, block_hint):
    """Say which classic mistake explains a wrong attention output; None when none does."""
    import torch
    q, k, v, causal = case["q"], case["k"], case["v"], case["causal"]
    n = q.shape[2]
    if not torch.isfinite(got.float()).all() and not causal:
        bad = torch.nonzero(~torch.isfinite(got.float()))[0].tolist()
        if case.get("large"):
            return (f"inf/NaN in the output (first at index {tuple(bad)}) with large scores: exp overflowed -- "
                    f"subtract the running max before exp")
    for message, keep, scale in scale_and_mask_variants(q, causal):
        if rel_err(got, masked_reference(q, k, v, keep, scale)) < tol:
            return message
    if causal:
        finite = torch.isfinite(got).all(dim=-1)  # rows that came out finite (a wrong mask can leave a row
        for message, keep in causal_variants(n):  # with no key at all, and 0/0 = NaN there)
            ref = masked_reference(q, k, v, keep)
            rows = finite & torch.isfinite(ref).all(dim=-1)
            if rows.sum() >= max(1, n // 8) and rel_err(got[rows], ref[rows]) < tol:
                return message
    # does it work at a multiple of the block, or with a single key block?
    for n_try, message in ((block_hint[1] * (n // block_hint[1]) if n > block_hint[1] else None,
                            "correct when N is a multiple of the block but wrong for N={n} -- mask keys >= N (their "
                            "scores to -inf, their V rows to 0), and the loads and stores of query rows >= N"),
                           (min(n, block_hint[0]),
                            "correct with a single key block but wrong with several (N={n}, key block "
                            f"{block_hint[0]}): rescale the accumulator and the sum by exp(m_old - m_new) whenever "
                            "the running max grows")):
        if not n_try or n_try == n:
            continue
        if message.startswith("correct when") and n % block_hint[1] == 0:
            continue
        q2, k2, v2 = make_inputs(q.shape[0], q.shape[1], n_try, q.shape[3], q.dtype, q.device)
        try:
            out2 = fn(q2, k2, v2, causal)
        except Exception:
            continue
        if rel_err(out2, masked_reference(q2, k2, v2, torch.ones(n_try, n_try, dtype=torch.bool).tril()
                                            if causal else None)) < tol:
            return message.format(n=n)
    return None


def random_inputs(b, h, n, d, dtype, device, scale=1.0, gen=None):
    """q, k, v of shape (b, h, n, d), each a view into a buffer followed by NaN padding: a kernel that reads past
    the end of a tensor reads NaN (and fails its check) instead of another allocation's memory."""
    import torch
    size, pad = b * h * n * d, 256 * 256
    out = []
    for s in (scale, 1.0, 1.0):
        buf = torch.randn(size + pad, generator=gen).to(device=device, dtype=dtype)
        buf[:size] *= s
        buf[size:] = float("nan")
        out.append(buf[:size].view(b, h, n, d))
    return tuple(out)


def check_attention(fn, cases, dtype, device, block_hint, label, seed, tiles=None, references=()):
    """`tiles` = (block_m, block_n): also check that no (N, N) tensor is formed and that the score tiles are at most
    block_m x block_n (a BLOCK_M / BLOCK_N mix-up gives block_n x block_m tiles)."""
    import torch

    from common.kernels.attention import reference_attention
    tol = TOL[str(dtype).replace("torch.", "")]
    gen = torch.Generator().manual_seed(seed)
    for b, h, n, d, causal, large in cases:
        q, k, v = random_inputs(b, h, n, d, dtype, device, scale=100.0 if large else 1.0, gen=gen)
        where = (f"B={b}, H={h}, N={n}, d={d}, {'causal' if causal else 'non-causal'}, "
                 f"{str(dtype).replace('torch.', '')}" + (", large scores" if large else "") + f" (seed {seed})")
        copies = [t.clone() for t in (q, k, v)]
        if tiles:
            guard = full_matrix_guard(n, n, max(tiles), record_tiles=d)
            with guard:
                got = learner_call(fn, (q, k, v, causal), f"{label} for {where}", references, library=True)
            if guard.shortcut:
                fail(f"{where}: {guard.shortcut} -- the exercise is the tiled loop itself (blocks of queries and "
                     f"keys, a running max and sum)")
            if guard.seen:
                fail(f"{where}: {guard.seen[0]} produced a tensor of shape {guard.seen[1]}: the N x N matrix was "
                     f"formed -- loop over blocks of block_n keys")
            big = [s for s in guard.tiles if s[-2] > tiles[0] or s[-1] > tiles[1]]
            if big:
                fail(f"{where}: a score tile of shape {big[0][-2:]} with block_m={tiles[0]}, block_n={tiles[1]}: "
                     f"S tiles must be (at most) block_m query rows x block_n keys -- are block_m and block_n "
                     f"swapped?")
        else:
            got = learner_call(fn, (q, k, v, causal), f"{label} for {where}", references, library=True)
        for name, t, c in zip("qkv", (q, k, v), copies):
            expect(torch.equal(t, c) or (torch.isnan(t) == torch.isnan(c)).all() and torch.equal(
                t.nan_to_num(), c.nan_to_num()), f"{where}: {label} modified its input {name} in place")
        expect(got is not None, f"{label} returned None for {where} -- return the output tensor")
        expect(tuple(got.shape) == (b, h, n, d), f"output shape for {where}: expected {(b, h, n, d)}, "
                                                 f"got {tuple(got.shape)}")
        ref = reference_attention(q, k, v, causal)
        err = rel_err(got, ref)
        if err < tol:
            if tiles and causal and unskipped(guard, b, h, n, *tiles):
                fail(f"{where}: the output is right, but every key block was multiplied, the ones entirely above the "
                     f"diagonal too (masked to -inf, they add nothing): skip them -- stop the key loop at the query "
                     f"block's last row, min(N, i + rows)")
            continue
        case = {"q": q, "k": k, "v": v, "causal": causal, "large": large}
        why = diagnose(fn, case, got.detach().to("cpu", ref.dtype), tol,
                        lambda *a: random_inputs(*a, gen=gen), block_hint)
        from common.core.checks import expect_close
        if why:
            fail(f"{where}: {why}")
        expect_close(got, ref, f"output for {where} (relative error {err:.2g}, allowed {tol:g})", rtol=tol,
                     atol=tol * float(ref.abs().max()))
    return len(cases)



WHOLE_ATTENTION = {  # torch calls that do the exercise's work in one step (a TorchFunctionMode sees them)
    "scaled_dot_product_attention": "torch's scaled_dot_product_attention (SDPA) computes the whole attention",
    "multi_head_attention_forward": "torch's multi_head_attention_forward (SDPA inside) computes the whole attention",
    "backward": "autograd (.backward()) computes the gradients for you",
    "grad": "autograd (torch.autograd.grad) computes the gradients for you",
}
# operators that are attention or its backward in one kernel: seen by name as torch functions, and spied on in
# torch.ops.aten (a route a TorchFunctionMode does not see)
FUSED_ATTENTION = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")


def _fused(name: str) -> str:
    what = "the gradients for you" if "backward" in name else "the whole attention"
    kind = "" if name.startswith("torch's") else ", torch's fused attention kernel,"
    return f"{name}{kind} computes {what}"


@contextlib.contextmanager
def fused_ops_spied(report):
    """While the block runs, a call of a fused attention operator through torch.ops.aten (the packet or one of its
    overloads), or of flex_attention's operator, calls `report(what)` first."""
    from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
    saved = {cls: cls.__call__ for cls in (OpOverloadPacket, OpOverload, HigherOrderOperator)}

    def spied(cls):
        real = saved[cls]

        def call(self, *args, **kwargs):
            name = getattr(self, "_qualified_op_name", None) or getattr(self, "_name", "")
            if name.startswith("aten::") and any(f in name for f in FUSED_ATTENTION):
                report(f"torch.ops.aten.{name[6:].split('.')[0]}")
            elif cls is HigherOrderOperator and "attention" in name:  # flex_attention and its backward
                report(f"torch's {name} (torch.nn.attention.flex_attention)")
            return real(self, *args, **kwargs)
        return call
    for cls in saved:
        cls.__call__ = spied(cls)
    try:
        yield
    finally:
        for cls, real in saved.items():
            cls.__call__ = real


def causal_score_elements(n: int, block_m: int, block_n: int) -> int:
    """Scores per (batch, head) of a causal tiled loop that skips the key blocks entirely above the diagonal: the
    (query block, key block) tiles with key start < the query block's end."""
    return sum(min(block_m, n - i) * min(block_n, n - j) for i in range(0, n, block_m)
               for j in range(0, min(n, i + block_m), block_n))


def unskipped(guard, b: int, h: int, n: int, block_m: int, block_n: int) -> bool:
    """The score tiles a causal loop formed add up to a whole number of N x N matrices (every key block, the ones
    above the diagonal included) and not to a whole number of the skipping loop's tiles."""
    per_head, rest = divmod(sum(math.prod(s) for s in guard.tiles), b * h)
    skip = causal_score_elements(n, block_m, block_n)
    return bool(per_head) and not rest and per_head % (n * n) == 0 and per_head % skip != 0


def full_matrix_guard(n_q, n_k, limit, record_tiles=None, blocks_of=None):
    """A TorchFunctionMode that records the shapes of every tensor produced and flags one with an (n_q, n_k) tail;
    with `record_tiles=d` it also keeps the shapes of matmul results whose last dim is not d (the score tiles); with
    `blocks_of={"q": q, "k": k}` it keeps, per name, the most rows of any slice taken directly from that tensor (the
    block size the loop really used). A fused attention operator called, as a torch function or through torch.ops.aten,
    is named in `shortcut`."""
    import torch
    from torch.overrides import TorchFunctionMode

    class Guard(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = None
            self.shortcut = None
            self.tiles = []
            self.rows = {}
            self.spies = fused_ops_spied(self._fused)

        def _fused(self, name):
            if self.shortcut is None:
                self.shortcut = _fused(name)

        def __enter__(self):
            self.spies.__enter__()
            return super().__enter__()

        def __exit__(self, *exc):
            try:
                return super().__exit__(*exc)
            finally:
                self.spies.__exit__(*exc)

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in WHOLE_ATTENTION and self.shortcut is None:
                self.shortcut = WHOLE_ATTENTION[name]
            elif any(f in name for f in FUSED_ATTENTION):
                self._fused(f"torch.{name}")
            out = func(*args, **(kwargs or {}))
            outs = out if isinstance(out, (tuple, list)) else (out,)
            if blocks_of and args and name in ("__getitem__", "split", "narrow", "chunk", "tensor_split"):
                for label, t in blocks_of.items():
                    if args[0] is t:
                        parts = [o for o in outs if isinstance(o, torch.Tensor) and o.dim() == t.dim()
                                 and o.shape[-1] == t.shape[-1] and 0 < o.shape[-2] < t.shape[-2]]
                        if parts:
                            self.rows[label] = max(self.rows.get(label, 0), *(o.shape[-2] for o in parts))
            if record_tiles and name in ("matmul", "__matmul__", "bmm", "einsum", "mm") and \
                    isinstance(out, torch.Tensor) and out.dim() >= 2 and out.shape[-1] != record_tiles:
                self.tiles.append(tuple(out.shape))
            for t in outs:
                if (self.seen is None and isinstance(t, torch.Tensor) and t.dim() >= 2
                        and t.shape[-2] > limit and t.shape[-1] > limit and t.shape[-2:] == (n_q, n_k)):
                    self.seen = (getattr(func, "__name__", str(func)), tuple(t.shape))
            return out
    return Guard()

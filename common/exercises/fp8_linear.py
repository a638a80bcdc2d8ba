"""Lab 05's build exercise: DeepSeek-V3's FP8 linear layer end to end -- both operands quantized with fine-grained
scales (1x128 activation tiles, 128x128 weight blocks, FP32 scale = amax / 448), the GEMM run per 128-wide K-block
through `torch._scaled_mm` and promoted into FP32 with the scales, and the bytes the quantized operands take.

A wrong answer is named by its mistake: each mistake's output is computed here (float64, from operands quantized the
way the mistake quantizes them) and the learner's y is matched against them, closest first.
"""
from __future__ import annotations

import torch

from common.core.checks import expect, expect_equal, fail
from common.exercises.cases import learner_call
from common.kernels import lowp, scaled_gemm

FP8_MAX = lowp.e4m3.max


def case(M: int, N: int, K: int, gen, zero_blocks: bool = False):
    """x (M, K) and w (N, K), float32, whose magnitudes differ a lot from one 128-wide K-block (and one 128x128
    weight block) to the next, so a scale on the wrong axis, one per tensor or one applied once is far from right;
    optionally an all-zero activation tile and weight block."""
    x = torch.randn(M, K, generator=gen, dtype=torch.float64)
    x *= torch.exp(1.5 * torch.randn(M, K // 128, generator=gen, dtype=torch.float64)).repeat_interleave(128, 1)
    w = torch.randn(N, K, generator=gen, dtype=torch.float64) * 0.02
    w *= torch.exp(1.5 * torch.randn(N // 128, K // 128, generator=gen, dtype=torch.float64)).repeat_interleave(
        128, 0).repeat_interleave(128, 1)
    if zero_blocks:
        x[0, :128] = 0.0
        w[:128, -128:] = 0.0
    return x.to(torch.float32), w.to(torch.float32)


def _quantize(t, rows: int, cols: int, fp8_max: float = FP8_MAX):
    """(codes as float64, scale per block (M/rows, K/cols) float64) with scale = amax / fp8_max in FP32, zero -> 1."""
    M, K = t.shape
    b = lowp.blocks(t.double(), rows, cols)
    scale = (b.abs().amax(-1) / fp8_max).to(torch.float32).double()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (b / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float32).to(scaled_gemm.FP8).double()
    return lowp.unblocks(q, rows, cols), scale


def _dequant(q, scale, rows, cols):
    return q * scale.repeat_interleave(rows, 0).repeat_interleave(cols, 1)


def reference(x, w):
    """(y float64, bytes) of the exercise: 1x128 activation tiles, 128x128 weight blocks, FP32 sums per K-block."""
    (M, K), N = x.shape, w.shape[0]
    xq, xs = _quantize(x, 1, 128)
    wq, ws = _quantize(w, 128, 128)
    return _dequant(xq, xs, 1, 128) @ _dequant(wq, ws, 128, 128).T, operand_bytes(M, N, K)


def operand_bytes(M: int, N: int, K: int, scale_bytes: int = 4, weight_tile=(128, 128)) -> int:
    """Bytes of the FP8 operands (1 byte per element) and their scales (FP32 by default)."""
    return M * K + N * K + scale_bytes * (M * K // 128 + N * K // (weight_tile[0] * weight_tile[1]))


def _gemm_mistakes(xq, xs, wq, ws):
    """(message, y) for the GEMM half's classic mistakes, operands quantized right (float64 codes and scales)."""
    K = xq.shape[1]
    parts = [xq[:, k * 128:(k + 1) * 128] @ wq[:, k * 128:(k + 1) * 128].T for k in range(K // 128)]
    wcol = ws.repeat_interleave(128, 0)  # (N, K/128): each output column's block scale
    full = xq @ wq.T
    scaled = [p * xs[:, k:k + 1] * wcol[:, k][None, :] for k, p in enumerate(parts)]
    bf16 = lambda t: t.to(torch.bfloat16).double()  # noqa: E731
    running = torch.zeros_like(full)
    for p in scaled:
        running = bf16(running + bf16(p))
    out = [
        ("the scales were never applied: y is the product of the raw FP8 codes -- multiply each K-block's partial sum "
         "by xs[:, k] and the weight block's scale", full),
        ("one scale per operand in the GEMM (the largest): the scales change from one K-block and one weight block to "
         "the next", full * xs.max() * ws.max()),
        ("the scales applied once, after summing all of K (the first K-block's scales for every block): each K-block's "
         "partial sum needs its own scales before the blocks are added -- that is the promotion",
         full * xs[:, :1] * wcol[:, :1].T),
        ("the scales applied upside down (y divided by them): the scale is a decoding scale, x ~= q * scale",
         sum(p / xs[:, k:k + 1] / wcol[:, k][None, :] for k, p in enumerate(parts))),
        ("the activation scales left out (only the weight scales applied)",
         sum(p * wcol[:, k][None, :] for k, p in enumerate(parts))),
        ("the weight scales left out (only the activation scales applied)",
         sum(p * xs[:, k:k + 1] for k, p in enumerate(parts))),
        ("weight scales repeated with .repeat (tiled) instead of .repeat_interleave: output column n takes the scale "
         "of block n // 128, not n % (N/128)",
         sum(p * xs[:, k:k + 1] * ws.repeat(128, 1)[:, k][None, :] for k, p in enumerate(parts))),
        ("the K-block sums were accumulated in bfloat16 (no promotion to FP32): keep the running sum in float32 and "
         "cast once", running),
        ("each K-block's product was rounded to bfloat16 before the sum (out_dtype=torch.bfloat16 per block): keep "
         "the K-block products in float32", sum(bf16(p) for p in scaled)),
    ]
    if ws.shape[0] == ws.shape[1]:
        wt = ws.T.repeat_interleave(128, 0)
        out.append(("weight scales on the wrong axis: ws is (N/128, K/128) -- rows follow the output columns, columns "
                    "the K-blocks", sum(p * xs[:, k:k + 1] * wt[:, k][None, :] for k, p in enumerate(parts))))
    return out


def _quantize_mistakes(x, w):
    """(message, y) for the quantization half's classic mistakes, the GEMM right."""
    xq, xs = _quantize(x, 1, 128)
    wq, ws = _quantize(w, 128, 128)
    (M, K), N = x.shape, w.shape[0]
    right_w, right_x = _dequant(wq, ws, 128, 128), _dequant(xq, xs, 1, 128)
    out = []
    for msg, (rows, cols) in (("one activation scale per row (over all of K) instead of one per 1x128 tile: a large "
                               "value anywhere in the row flattens the rest of it", (1, K)),
                              ("one activation scale for the whole tensor instead of one per 1x128 tile", (M, K))):
        q, s = _quantize(x, rows, cols)
        out.append((msg, _dequant(q, s, rows, cols) @ right_w.T))
    if M % 128 == 0:
        q, s = _quantize(x, 128, 1)
        out.append(("activation tiles along the tokens (128 x 1) instead of along K (1 x 128)",
                    _dequant(q, s, 128, 1) @ right_w.T))
    for msg, (rows, cols) in (("weights scaled per 1x128 tile: DeepSeek-V3 keeps one scale per 128x128 block "
                               "(128 output channels x 128 input channels)", (1, 128)),
                              ("one weight scale per output row (over all of K) instead of one per 128x128 block",
                               (1, K)),
                              ("one weight scale for the whole tensor instead of one per 128x128 block", (N, K))):
        q, s = _quantize(w, rows, cols)
        out.append((msg, right_x @ _dequant(q, s, rows, cols).T))
    out.append(("x and w were never quantized: y is the float32 product x @ w.T -- quantize both to FP8 E4M3 with "
                "their scales first (that is the layer's point: half the bytes of BF16)", x.double() @ w.double().T))
    for msg, top in (("the scale is amax / 127 (int8's largest value): E4M3's largest value is 448 -- amax / 448 "
                      "uses the whole FP8 range", 127.0),
                     ("the scale is amax / 57344 (E5M2's largest value): the values land far below E4M3's range "
                      "and lose their bits -- amax / 448", 57344.0)):
        qx, sx = _quantize(x, 1, 128, top)
        qw, sw = _quantize(w, 128, 128, top)
        out.append((msg, _dequant(qx, sx, 1, 128) @ _dequant(qw, sw, 128, 128).T))
    return out


BYTES_MISTAKES = (
    (lambda M, N, K: M * K + N * K, "the bytes leave out the scales (one FP32 number per 1x128 tile and per 128x128 "
                                    "block)"),
    (lambda M, N, K: operand_bytes(M, N, K, scale_bytes=1), "the scales are counted as 1 byte each: they are FP32"),
    (lambda M, N, K: 8 * operand_bytes(M, N, K), "the bytes are counted in bits"),
    (lambda M, N, K: 2 * (M * K + N * K), "that is BF16's count (2 bytes per element): FP8 takes 1, plus the scales"),
    (lambda M, N, K: operand_bytes(M, N, K, weight_tile=(1, 128)), "the weight scales are counted per 1x128 tile: "
                                                                   "one per 128x128 block"),
)


def check(fp8_linear, cases, references=(), allowed=(), used=None) -> str:
    """fp8_linear(x, w) -> (y, bytes): see the module docstring; `used` collects the workbook's functions it called."""
    gen, rng = cases.gen, cases.rng
    used = set() if used is None else used
    shapes = [(64, 256, 256, False), (48, 384, 512, True),
              (rng.randint(1, 40), 128 * rng.randint(1, 3), 128 * rng.randint(1, 4), rng.random() < 0.5)]
    scaled_mm_calls = 0
    for M, N, K, zeros in shapes:
        x, w = case(M, N, K, gen, zeros)
        what = f"fp8_linear(x {tuple(x.shape)}, w {tuple(w.shape)})" + (" with an all-zero tile" if zeros else "")
        copies = (x.clone(), w.clone())
        with _ScaledMmCount() as count:
            out = learner_call(fp8_linear, (x, w), what, references, used, allowed=allowed, library=True)
        scaled_mm_calls += count.calls
        expect(torch.equal(x, copies[0]) and torch.equal(w, copies[1]), f"{what} modified its input x or w")
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            fail(f"{what} must return (y, nbytes); got {type(out).__name__}")
        y, nbytes = out
        if not isinstance(y, torch.Tensor):
            fail(f"{what}: y is a {type(y).__name__}; expected a torch.Tensor of shape {(M, N)}")
        expect_equal(tuple(y.shape), (M, N), f"{what}: shape of y")
        if y.dtype == scaled_gemm.FP8:
            fail(f"{what} returned y in float8: the output of a scaled GEMM is float32 -- pass out_dtype=torch.float32")
        ref, ref_bytes = reference(x, w)
        g = y.detach().to(torch.float64)
        if not torch.isfinite(g).all():
            fail(f"{what}: y has NaN/inf" + (" -- an all-zero tile or block has amax 0, so its scale is 0 and x / 0 is "
                                             "NaN: give such a block the scale 1 (its codes are 0 anyway)"
                                             if zeros else ""))
        scale = float(ref.abs().max())
        off = float((g - ref).abs().max())
        if off > 1e-4 * scale:
            xq, xs = _quantize(x, 1, 128)
            wq, ws = _quantize(w, 128, 128)
            near = sorted((float((g - v).abs().max()) / (float(v.abs().max()) or 1.0), msg) for msg, v in
                          _quantize_mistakes(x, w) + _gemm_mistakes(xq, xs, wq, ws))
            if near and near[0][0] < min(off / scale / 4, 2e-3):  # a mistake explains y far better than the answer
                fail(f"{what}: {near[0][1]}")
            idx = tuple(int(i) for i in torch.nonzero((g - ref).abs() == off)[0])
            fail(f"{what}: y{idx} = {float(g[idx]):.9g}, expected {float(ref[idx]):.9g} (an FP32 sum of FP8 products "
                 f"agrees to 1e-4 of max|y|)")
        try:
            nbytes = int(nbytes)
        except (TypeError, ValueError):
            fail(f"{what}: nbytes is {nbytes!r}; expected a whole number of bytes")
        if nbytes != ref_bytes:
            for wrong, msg in BYTES_MISTAKES:
                if nbytes == wrong(M, N, K):
                    fail(f"{what}: nbytes = {nbytes:,}: {msg}")
            fail(f"{what}: nbytes = {nbytes:,}, expected {ref_bytes:,}: x and w at 1 byte per element, plus 4 bytes "
                 f"per scale (M*K/128 activation scales, N*K/16384 weight scales)")
    if used:
        fail(f"the numbers are right, but they come from {', '.join(sorted(used))}: this exercise is to quantize and "
             f"run the GEMM yourself (torch._scaled_mm, torch's float8 cast and lowp.blocks are fine)")
    how = "through torch._scaled_mm" if scaled_mm_calls else "without torch._scaled_mm (a float emulation)"
    return (f"1x128 activation tiles and 128x128 weight blocks, FP8 products summed per K-block in FP32 {how}, and the "
            f"operands' bytes, right for {len(shapes)} shapes (all-zero blocks included)")


class _ScaledMmCount(torch.overrides.TorchFunctionMode):
    """How many times torch._scaled_mm (or torch.nn.functional.scaled_mm) is called inside."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("_scaled_mm", "scaled_mm"):
            self.calls += 1
        return func(*args, **(kwargs or {}))

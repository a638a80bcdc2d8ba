"""Lab 05 checkers: right answers pass, each classic mistake fails with a telling message, stubs are 'not attempted'."""
import numpy as np
import pytest
import torch

from learner import own_copy

from common.core.checks import CheckFailed
from common.exercises.lab05 import (
    check_bytes_per_param,
    check_format_facts,
    check_mx_quantize,
    check_nvfp4_quantize,
    check_promoted_sum,
    check_quantize_fp8_blockwise,
    check_round_to_e4m3,
)
from common.kernels import lowp

pytestmark = pytest.mark.usefixtures("one_thread")


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 5.x: replace this line with your code")


@pytest.mark.parametrize("check", [check_format_facts, check_round_to_e4m3, check_quantize_fp8_blockwise,
                                   check_mx_quantize, check_nvfp4_quantize, check_promoted_sum,
                                   check_bytes_per_param])
def test_stub_is_not_attempted(check):
    assert check(stub).status == "not attempted"


# ------------------------------------------------------------------------------------------------ 5.1
def facts(e, m, special):
    bias = 2 ** (e - 1) - 1
    top = 2 ** e - 1
    emax = (top - 1 if special == "ieee" else top) - bias
    frac = 1 - 2.0 ** -m * (2 if special == "fn" else 1)
    return {"max": (1 + frac) * 2.0 ** emax, "smallest_normal": 2.0 ** (1 - bias),
            "smallest_subnormal": 2.0 ** (1 - bias - m), "eps": 2.0 ** -m}


def test_format_facts_right():
    assert check_format_facts(facts).passed


def test_format_facts_ieee_rule_for_e4m3():
    def wrong(e, m, special):
        return facts(e, m, "ieee")
    with pytest.raises(CheckFailed, match="IEEE answer"):
        check_format_facts(wrong)


def test_format_facts_forgets_nan_code():
    def wrong(e, m, special):
        return facts(e, m, "none" if special == "fn" else special)
    with pytest.raises(CheckFailed, match="all-ones mantissa"):
        check_format_facts(wrong)


def test_format_facts_from_the_reference_class():
    def via_format(e, m, special):  # the workbook's own class does the arithmetic
        f = lowp.Format("mine", e, m, special)
        return {"max": f.max, "smallest_normal": f.smallest_normal, "smallest_subnormal": f.smallest_subnormal,
                "eps": f.eps}
    with pytest.raises(CheckFailed, match="lowp.Format is the workbook's reference"):
        check_format_facts(via_format)


def test_format_facts_half_eps():
    def wrong(e, m, special):
        return {**facts(e, m, special), "eps": 2.0 ** -(m + 1)}
    with pytest.raises(CheckFailed, match="unit roundoff"):
        check_format_facts(wrong)


# ------------------------------------------------------------------------------------------------ 5.2
def round_e4m3(x):
    a = x.double().abs()
    e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a)))).clamp(min=-6)
    step = 2.0 ** (e - 3)
    q = torch.round(a / step) * step
    return torch.copysign(q.clamp(max=448.0), x.double())


def test_round_right():
    assert check_round_to_e4m3(round_e4m3).passed


def test_round_half_away_from_zero():
    def wrong(x):
        a = x.double().abs()
        e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a)))).clamp(min=-6)
        step = 2.0 ** (e - 3)
        return torch.copysign((torch.floor(a / step + 0.5) * step).clamp(max=448.0), x.double())
    with pytest.raises(CheckFailed, match="half to EVEN"):
        check_round_to_e4m3(wrong)


def test_round_no_saturation():
    def wrong(x):
        q = round_e4m3(x)
        return torch.where(x.abs() > 464, torch.full_like(q, float("nan")), q)
    with pytest.raises(CheckFailed, match="no saturation"):
        check_round_to_e4m3(wrong)


def test_round_flushes_subnormals():
    def wrong(x):
        q = round_e4m3(x)
        return torch.where(x.abs() < 2.0 ** -6, torch.zeros_like(q), q)
    with pytest.raises(CheckFailed, match="subnormals"):
        check_round_to_e4m3(wrong)


# ------------------------------------------------------------------------------------------------ 5.3
def fp8_blockwise(x, block):  # written out: the checker refuses lowp.quantize
    bm, bk = block
    if x.shape[0] % bm or x.shape[1] % bk:
        raise ValueError(f"block={block} does not tile x of shape {tuple(x.shape)}")
    b = lowp.blocks(x.double(), bm, bk)
    s = (b.abs().amax(-1) / 448).float().double()
    s = torch.where(s > 0, s, torch.ones_like(s))
    return lowp.unblocks(lowp.round_to(b / s[..., None], lowp.e4m3), bm, bk), s


def test_fp8_blockwise_right():
    assert check_quantize_fp8_blockwise(fp8_blockwise).passed


def test_fp8_blockwise_wrong_axis():
    def wrong(x, block):
        qt = lowp.quantize(x.T.contiguous(), lowp.e4m3, block, "fp32")
        return qt.q.T, qt.scale.T
    with pytest.raises(CheckFailed, match="wrong block axis"):
        check_quantize_fp8_blockwise(wrong)


def test_fp8_blockwise_inverted_scale():
    def wrong(x, block):
        q, s = fp8_blockwise(x, block)
        return q, 1 / s
    with pytest.raises(CheckFailed, match="upside down"):
        check_quantize_fp8_blockwise(wrong)


def test_fp8_blockwise_wrong_scale():
    def wrong(x, block):  # half the scale (as from a clipped amax), no clamp
        qt = lowp.quantize(x, lowp.e4m3, block, "fp32")
        s = qt.scale * 0.5
        full = s.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
        return lowp.round_to(x.double() / full, lowp.e4m3, saturate=False), s
    with pytest.raises(CheckFailed, match="scale for block"):
        check_quantize_fp8_blockwise(wrong)


def test_fp8_blockwise_pads_silently():
    with pytest.raises(CheckFailed, match="did not refuse"):
        check_quantize_fp8_blockwise(lambda x, b: fp8_blockwise(x, b) if x.shape[-1] % b[1] == 0 else
                                     (lowp.quantize(x, lowp.e4m3, b, "fp32", pad=True).q, None))


# ------------------------------------------------------------------------------------------------ 5.4
def mx(x, elem, block=32):
    b = lowp.blocks(x.double(), 1, block)
    amax = b.abs().amax(-1)
    e = torch.floor(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax)))) - elem.emax
    s = 2.0 ** torch.where(amax > 0, e, torch.full_like(e, -127.0)).clamp(-127, 127)
    return lowp.unblocks(lowp.round_to(b / s[..., None], elem), 1, block), s


def test_mx_right():
    assert check_mx_quantize(mx).passed


def test_mx_scale_not_power_of_two():
    def wrong(x, elem, block=32):
        qt = lowp.quantize(x, elem, (1, block), "fp32")
        return qt.q, qt.scale
    with pytest.raises(CheckFailed, match="powers of two"):
        check_mx_quantize(wrong)


def test_mx_ceil_scale():
    def wrong(x, elem, block=32):
        qt = lowp.quantize(x, elem, (1, block), "e8m0", e8m0_rounding="ceil")
        return qt.q, qt.scale
    with pytest.raises(CheckFailed, match="rounded the exponent up"):
        check_mx_quantize(wrong)


def test_mx_no_saturation():
    def wrong(x, elem, block=32):
        qt = lowp.quantize(x, elem, (1, block), "e8m0")
        full = qt.scale.repeat_interleave(block, 1)
        # round without clamping: E2M1 values above 6 keep growing on the 2^(e-1) grid
        a = (x.double() / full).abs()
        e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a)))).clamp(min=elem.emin)
        step = 2.0 ** (e - elem.man_bits)
        return torch.copysign(torch.round(a / step) * step, x.double()), qt.scale
    with pytest.raises(CheckFailed, match="no saturation"):
        check_mx_quantize(wrong)


def test_mx_wrong_axis():
    def wrong(x, elem, block=32):
        qt = lowp.quantize(x.T.contiguous(), elem, (1, block), "e8m0")
        return qt.q.T, qt.scale.T
    with pytest.raises(CheckFailed, match="wrong block axis"):
        check_mx_quantize(wrong)


# ------------------------------------------------------------------------------------------------ 5.5
def nvfp4(x):
    b = lowp.blocks(x.double(), 1, 16)
    amax = float(b.abs().max())
    ts = float(np.float32(amax / (6 * 448))) if amax > 0 else 1.0
    bs = lowp.round_to(b.abs().amax(-1) / 6 / ts, lowp.e4m3)
    s = bs * ts
    q = torch.where(s[..., None] > 0, lowp.round_to(b / torch.where(s > 0, s, torch.ones_like(s))[..., None],
                                                    lowp.e2m1), torch.zeros_like(b))
    return lowp.unblocks(q, 1, 16), bs, ts


def test_nvfp4_right():
    assert check_nvfp4_quantize(nvfp4).passed


def test_nvfp4_fp32_block_scale():
    def wrong(x):
        q, bs, ts = nvfp4(x)
        amax = x.double().reshape(x.shape[0], -1, 16).abs().amax(-1)
        return q, amax / 6 / ts, ts
    with pytest.raises(CheckFailed, match="not an FP8 E4M3 value"):
        check_nvfp4_quantize(wrong)


def test_nvfp4_block_scale_rounded_up():
    """Rounding the block scale up agrees with the nearest rounding on about half the blocks: it passed on about 4
    draws in 20,000. One case puts every block's amax just above an E4M3 value."""
    def up(x):
        q, bs, ts = nvfp4(x)
        b = lowp.blocks(x.double(), 1, 16)
        v = b.abs().amax(-1) / 6 / ts
        grid = torch.tensor(sorted(set(lowp.e4m3.values())), dtype=torch.float64)
        bs_up = grid[torch.searchsorted(grid, v.clamp(max=448.0))]
        s = bs_up * ts
        q = torch.where(s[..., None] > 0, lowp.round_to(b / torch.where(s > 0, s, torch.ones_like(s))[..., None],
                                                        lowp.e2m1), torch.zeros_like(b))
        return lowp.unblocks(q, 1, 16), bs_up, ts
    for seed in range(5):
        with pytest.raises(CheckFailed, match="rounded block_amax / 6 / tensor_scale UP"):
            check_nvfp4_quantize(up, seed=seed)


def test_nvfp4_no_tensor_scale():
    def wrong(x):
        qt = lowp.quantize(x, lowp.e2m1, (1, 16), "e4m3", tensor_scale=False)
        return qt.q, qt.block_scale, 1.0
    with pytest.raises(CheckFailed, match="tensor_scale is 1"):
        check_nvfp4_quantize(wrong)


def test_nvfp4_block_of_32():
    def wrong(x):
        qt = lowp.quantize(x, lowp.e2m1, (1, 32), "e4m3", tensor_scale=True)
        return qt.q, qt.block_scale, qt.tensor_scale
    with pytest.raises(CheckFailed, match="MXFP4's block"):
        check_nvfp4_quantize(wrong)


# ------------------------------------------------------------------------------------------------ 5.6
def promoted(products, acc_bits, promote_every):
    p = np.asarray(products, dtype=np.float64)
    acc = np.zeros(p.shape[0])
    total = np.zeros(p.shape[0])
    for k in range(p.shape[1]):
        acc = lowp.round_significand(acc + p[:, k], acc_bits)
        if (k + 1) % promote_every == 0:
            total, acc = total + acc, np.zeros_like(acc)
    return total + acc


def test_promoted_right():
    assert check_promoted_sum(promoted).passed


def test_promoted_never():
    with pytest.raises(CheckFailed, match="never promote"):
        check_promoted_sum(lambda p, bits, every: lowp.accumulate(p, bits, None))


def test_promoted_no_restart():
    def wrong(products, acc_bits, promote_every):
        p = np.asarray(products, dtype=np.float64)
        acc, total = np.zeros(p.shape[0]), np.zeros(p.shape[0])
        for k in range(p.shape[1]):
            acc = lowp.round_significand(acc + p[:, k], acc_bits)
            if (k + 1) % promote_every == 0:
                total = total + acc
        return total + acc
    with pytest.raises(CheckFailed, match="restart"):
        check_promoted_sum(wrong)


# ------------------------------------------------------------------------------------------------ 5.7
def test_bytes_right():
    assert check_bytes_per_param(lambda e, s, b: e / 8 + s / 8 / b).passed


def test_bytes_no_scale():
    with pytest.raises(CheckFailed, match="leaves out the scale"):
        check_bytes_per_param(lambda e, s, b: e / 8)


def test_bytes_scale_in_bits():
    with pytest.raises(CheckFailed, match="in bits"):
        check_bytes_per_param(lambda e, s, b: e / 8 + s / b)


# ------------------------------------------------------------------------------------------------ 5.8
from common.exercises.lab05 import check_fp8_linear  # noqa: E402
from common.kernels import scaled_gemm  # noqa: E402

FP8 = torch.float8_e4m3fn


def _blocks_quantize(t, rows, cols, top=448.0):
    """(q float8, scale (M/rows, K/cols) float32), scale = amax / top, all-zero blocks -> 1."""
    M, K = t.shape
    b = t.reshape(M // rows, rows, K // cols, cols)
    s = (b.abs().amax(dim=(1, 3)) / top).float()
    s = torch.where(s > 0, s, torch.ones_like(s))
    q = (b / s[:, None, :, None]).clamp(-448, 448).reshape(M, K).to(FP8)
    return q, s


def fp8_linear(x, w, mistake=None):
    """The exercise written out, with one named mistake where asked."""
    (M, K), N = x.shape, w.shape[0]
    x_tile = {"x_row": (1, K), "x_tensor": (M, K)}.get(mistake, (1, 128))
    w_tile = {"w_1x128": (1, 128), "w_row": (1, K), "w_tensor": (N, K)}.get(mistake, (128, 128))
    top = {"int8_max": 127.0, "e5m2_max": 57344.0}.get(mistake, 448.0)
    xq, xs = _blocks_quantize(x, *x_tile, top=top)
    wq, ws = _blocks_quantize(w, *w_tile, top=top)
    xs = xs.repeat_interleave(x_tile[0], 0).repeat_interleave(x_tile[1] // 128, 1)  # back to (M, K/128)
    w_col = ws.repeat_interleave(w_tile[0], 0).repeat_interleave(w_tile[1] // 128, 1)  # (N, K/128)
    if mistake == "repeat_not_interleave":
        w_col = ws.repeat(128, 1)
    if mistake == "inverted":
        xs, w_col = 1 / xs, 1 / w_col
    one = torch.ones((), dtype=torch.float32)
    y = torch.zeros(M, N, dtype=torch.bfloat16 if mistake == "bf16_acc" else torch.float32)
    for k in range(K // 128):
        kb = slice(128 * k, 128 * (k + 1))
        part = torch._scaled_mm(xq[:, kb], wq[:, kb].t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        if mistake == "no_x_scale":
            y += part * w_col[:, k][None, :]
        elif mistake == "once":
            y += part
        else:
            y += (part * xs[:, k:k + 1] * w_col[:, k][None, :]).to(y.dtype)
    if mistake == "once":
        y = y * xs[:, :1] * w_col[:, :1].T
    if mistake == "unquantized":
        y = x @ w.T
    nbytes = {"bytes_no_scales": M * K + N * K, "bytes_bf16": 2 * (M * K + N * K)}.get(
        mistake, xq.numel() + wq.numel() + 4 * (M * K // 128 + N * K // 16384))
    return y.float(), nbytes


def test_fp8_linear_right():
    assert check_fp8_linear(fp8_linear).passed
    assert check_fp8_linear(fp8_linear, seed=123).passed
    assert check_fp8_linear(lambda x, w: (fp8_linear(x, w)[0].double(), fp8_linear(x, w)[1])).passed
    assert check_fp8_linear(own_copy(fp8_linear)).passed


def test_fp8_linear_float_emulation_passes_and_says_so():
    def emulated(x, w):  # dequantized codes in float32: the same numbers, no _scaled_mm
        y, nbytes = fp8_linear(x, w)
        return y, nbytes
    verdict = check_fp8_linear(emulated)
    assert verdict.passed and "through torch._scaled_mm" in verdict.detail


FP8_LINEAR_MISTAKES = [
    ("x_row", "one activation scale per row"), ("x_tensor", "one activation scale for the whole tensor"),
    ("w_1x128", "weights scaled per 1x128 tile"), ("w_row", "one weight scale per output row"),
    ("w_tensor", "one weight scale for the whole tensor"), ("int8_max", "amax / 127"),
    ("e5m2_max", "amax / 57344"), ("inverted", "upside down"), ("repeat_not_interleave", "repeat_interleave"),
    ("bf16_acc", "bfloat16"), ("no_x_scale", "activation scales left out"), ("once", "applied once"),
    ("bytes_no_scales", "leave out the scales"), ("bytes_bf16", "BF16's count"),
    ("unquantized", "never quantized"),
]


@pytest.mark.parametrize("mistake, words", FP8_LINEAR_MISTAKES, ids=[m for m, _ in FP8_LINEAR_MISTAKES])
def test_fp8_linear_mistakes_named(mistake, words):
    with pytest.raises(CheckFailed, match=words) as e:
        check_fp8_linear(lambda x, w: fp8_linear(x, w, mistake))
    assert "seed=" in str(e.value)


def test_fp8_linear_zero_block_nan_named():
    def nan_scales(x, w):
        (M, K), N = x.shape, w.shape[0]
        xs = x.reshape(M, K // 128, 128).abs().amax(-1) / 448  # 0 for an all-zero tile: 0 / 0 below
        y, nbytes = fp8_linear(x, w)
        return y * (xs.sum() / xs.sum()) * torch.where(xs.min() > 0, 1.0, float("nan")), nbytes
    with pytest.raises(CheckFailed, match="all-zero tile or block"):
        for seed in range(4):  # the second fixed case has an all-zero tile
            check_fp8_linear(nan_scales, seed=seed)


def test_fp8_linear_shapes_and_calls_reported():
    with pytest.raises(CheckFailed, match="must return .y, nbytes."):
        check_fp8_linear(lambda x, w: fp8_linear(x, w)[0])
    with pytest.raises(CheckFailed, match="returned y in float8"):
        check_fp8_linear(lambda x, w: (fp8_linear(x, w)[0].to(FP8), fp8_linear(x, w)[1]))

    def mutates(x, w):
        out = fp8_linear(x, w)
        x.mul_(2)
        return out
    with pytest.raises(CheckFailed, match="modified its input"):
        check_fp8_linear(mutates)
    with pytest.raises(CheckFailed, match="scaled_gemm.quantize_fp8"):
        check_fp8_linear(lambda x, w: (scaled_gemm.scaled_mm_fine_grained(
            *scaled_gemm.quantize_fp8(x, (1, 128)), *scaled_gemm.quantize_fp8(w, (128, 128))), fp8_linear(x, w)[1]))
    assert check_fp8_linear(stub).status == "not attempted"


# ------------------------------------------------------------------------------------------------ issue 12 audit
# One test per class a checker was touched for: fixed cases for every format/size (1), parameters varied (2),
# edge cases fed (4), aliasing mistakes named (5), learner errors reported as calls (6), right answers in another
# dtype accepted (7), and a fresh seed per call printed in failures.

def test_seed_is_fresh_printed_and_replays():
    fixed = {(f.exp_bits, f.man_bits) for f in lowp.FORMATS.values()}

    def wrong(e, m, special):  # right on the fixed cases (the named formats), wrong on almost every random layout
        f = facts(e, m, special)
        return f if (e, m) in fixed else {**f, "eps": 0.0}
    seeds = set()
    for _ in range(40):
        try:
            check_format_facts(wrong)
        except CheckFailed as exc:
            seed = int(str(exc).split("replay with seed=")[1].rstrip("]"))
            seeds.add(seed)
            with pytest.raises(CheckFailed, match=f"seed={seed}"):
                check_format_facts(wrong, seed=seed)  # the same seed fails again
            if len(seeds) > 1:
                break
    assert len(seeds) > 1  # fresh seeds, not one memorised case


def test_learner_exception_reported_as_the_call():  # class 6
    def asserts(e, m, special):
        assert special in ("ieee", "fn"), "unknown special"
        return facts(e, m, special)
    with pytest.raises(CheckFailed, match=r"format_facts\(2, 1, 'none'\): your code raised AssertionError"):
        check_format_facts(asserts)
    with pytest.raises(CheckFailed, match=r"bytes_per_param\(8, 8, 32\): your code raised RuntimeError"):
        check_bytes_per_param(lambda e, s, b: (_ for _ in ()).throw(RuntimeError("no")))
    with pytest.raises(CheckFailed, match="must return a tuple of 2"):
        check_mx_quantize(lambda x, elem, block=32: mx(x, elem, block)[0])


def test_round_in_float32_or_float8_accepted():  # class 7
    assert check_round_to_e4m3(lambda x: round_e4m3(x).float()).passed


def test_references_refused_where_the_exercise_is_to_write_them():
    with pytest.raises(CheckFailed, match="cast to a torch float8 dtype"):
        check_round_to_e4m3(lambda x: x.float().to(torch.float8_e4m3fn))
    with pytest.raises(CheckFailed, match=r"come from common.kernels.lowp.formats.round_to"):
        check_round_to_e4m3(lambda x: lowp.round_to(x, lowp.e4m3))
    with pytest.raises(CheckFailed, match=r"come from common.kernels.lowp.block_scaling.quantize"):
        check_quantize_fp8_blockwise(lambda x, b: (lambda qt: (qt.q, qt.scale))(lowp.quantize(x, lowp.e4m3, b)))
    with pytest.raises(CheckFailed, match=r"common.kernels.lowp.block_scaling.quantize"):
        check_mx_quantize(lambda x, elem, block=32: (lambda qt: (qt.q, qt.scale))(
            lowp.quantize(x, elem, (1, block), "e8m0")))
    with pytest.raises(CheckFailed, match=r"common.kernels.lowp.accuracy.accumulate"):
        check_promoted_sum(lambda p, bits, every: lowp.accumulate(p, bits, every))
    with pytest.raises(CheckFailed, match=r"common.kernels.lowp.storage.bytes_per_param"):
        check_bytes_per_param(lowp.bytes_per_param)
    assert check_quantize_fp8_blockwise(lambda x, b: (fp8_blockwise(x, b)[0].float().to(torch.float8_e4m3fn),
                                                      fp8_blockwise(x, b)[1].float())).passed


def test_fp8_blockwise_hard_coded_128_columns():  # class 2: the block's K size ignored
    def wrong(x, block):
        return fp8_blockwise(x, (block[0], 128)) if x.shape[1] % 128 == 0 else fp8_blockwise(x, block)
    with pytest.raises(CheckFailed, match=r"scale shape: expected \(32, 4\)"):
        check_quantize_fp8_blockwise(wrong)


def test_fp8_blockwise_rows_and_columns_swapped():  # class 5: a BLOCK_M / BLOCK_K mix-up named as such
    def wrong(x, block):
        qt = lowp.quantize(x, lowp.e4m3, tuple(reversed(block)), "fp32")
        return qt.q, qt.scale.reshape(x.shape[0] // block[0], x.shape[1] // block[1])
    with pytest.raises(CheckFailed, match="rows and columns swapped|wrong block axis"):
        check_quantize_fp8_blockwise(wrong)

    def wrong_2x64(x, block):  # right for 1x128 and 128x128, swapped for 2x64
        return wrong(x, block) if block == (2, 64) else fp8_blockwise(x, block)
    with pytest.raises(CheckFailed, match=r"rows and columns swapped: your scales are those of 64x2 blocks"):
        check_quantize_fp8_blockwise(wrong_2x64)


def test_fp8_blockwise_zero_block_nan():  # class 4
    def wrong(x, block):
        bm, bk = block
        if x.shape[0] % bm or x.shape[1] % bk:
            raise ValueError("does not tile")
        b = lowp.blocks(x.double(), bm, bk)
        s = (b.abs().amax(-1) / 448).float().double()  # no guard: 0 / 0
        return lowp.unblocks(lowp.round_to(b / s[..., None], lowp.e4m3), bm, bk), s
    with pytest.raises(CheckFailed, match="all zeros"):
        check_quantize_fp8_blockwise(wrong)


def test_fp8_blockwise_rows_not_refused():  # class 4: only K checked
    def wrong(x, block):
        if x.shape[1] % block[1]:
            raise ValueError("K does not tile")
        qt = lowp.quantize(x, lowp.e4m3, block, "fp32", pad=True)
        return qt.q[:x.shape[0]], qt.scale
    with pytest.raises(CheckFailed, match=r"\(100, 256\).*did not refuse"):
        check_quantize_fp8_blockwise(wrong)


def test_mx_block_hard_coded_32():  # class 2: MX block size varied
    with pytest.raises(CheckFailed, match="block=16"):
        check_mx_quantize(lambda x, elem, block=32: mx(x, elem, 32))


def test_mx_zero_block_nan():  # class 4
    def wrong(x, elem, block=32):
        b = lowp.blocks(x.double(), 1, block)
        s = 2.0 ** (torch.floor(torch.log2(b.abs().amax(-1))) - elem.emax)  # log2(0) = -inf -> scale 0
        return lowp.unblocks(lowp.round_to(b / s[..., None], elem), 1, block), s
    with pytest.raises(CheckFailed, match="all zeros"):
        check_mx_quantize(wrong)


def test_mx_emax_hard_coded_for_fp8():  # class 1: E5M2 has its own fixed case
    def wrong(x, elem, block=32):
        emax = 2 if elem.bits == 4 else 8  # right for E2M1 and E4M3, wrong for E5M2 (emax 15)
        b = lowp.blocks(x.double(), 1, block)
        amax = b.abs().amax(-1)
        e = torch.floor(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax)))) - emax
        s = 2.0 ** torch.where(amax > 0, e, torch.full_like(e, -127.0))
        return lowp.unblocks(lowp.round_to(b / s[..., None], elem), 1, block), s
    with pytest.raises(CheckFailed, match="E5M2.*scale|scale.*2\\^\\(floor"):
        check_mx_quantize(wrong)


def test_nvfp4_zero_block_nan():  # class 4
    def wrong(x):
        b = lowp.blocks(x.double(), 1, 16)
        ts = float(np.float32(float(b.abs().max()) / (6 * 448)))
        bs = lowp.round_to(b.abs().amax(-1) / 6 / ts, lowp.e4m3)
        q = lowp.round_to(b / (bs * ts)[..., None], lowp.e2m1)  # 0 / 0 in an all-zero block
        return lowp.unblocks(q, 1, 16), bs, ts
    with pytest.raises(CheckFailed, match="all zeros"):
        check_nvfp4_quantize(wrong)


def test_promoted_parameters_ignored():  # class 2
    with pytest.raises(CheckFailed, match="acc_bits"):
        check_promoted_sum(lambda p, bits, every: promoted(p, 14, every))
    with pytest.raises(CheckFailed, match="promote every 128"):
        check_promoted_sum(lambda p, bits, every: promoted(p, bits, 128))


def test_promoted_float32_total_accepted():  # class 7
    assert check_promoted_sum(lambda p, bits, every: promoted(p, bits, every).astype(np.float32)).passed


def test_bytes_whole_scale_per_element():  # class 5
    with pytest.raises(CheckFailed, match="whole scale"):
        check_bytes_per_param(lambda e, s, b: (e + s) / 8)


@pytest.mark.parametrize("check, quantize", [
    (check_quantize_fp8_blockwise, lambda x, block: lowp.quantize(x, lowp.e4m3, block, "fp32")),
    (check_mx_quantize, lambda x, elem, block=32: lowp.quantize(x, elem, (1, block), "e8m0")),
])
def test_dequantized_q_is_named(check, quantize):
    """Returning q x scale (the dequantized tensor) instead of q was told it rounds wrongly: it is named."""
    own = own_copy(quantize)

    def dequantized(*args, **kwargs):
        qt = own(*args, **kwargs)
        bm, bk = (qt.q.shape[0] // qt.scale.shape[0], qt.q.shape[1] // qt.scale.shape[1])
        return qt.q * qt.scale.repeat_interleave(bm, 0).repeat_interleave(bk, 1), qt.scale
    with pytest.raises(CheckFailed, match="dequantized values"):
        check(dequantized)


# ------------------------------------------------------------------------------------------------ issue 46
# Right answers written differently pass under the library watch: what each exercise hands out (lowp.blocks,
# round_to, Format's properties, round_significand) is allowed; the rest of the library is refused.

def test_right_answers_written_differently():
    def facts_by_codes(e, m, special):  # the largest code's value, built from its bits
        bias = 2 ** (e - 1) - 1
        top_exp = 2 ** e - (2 if special == "ieee" else 1)
        top_man = 2 ** m - (2 if special == "fn" else 1)
        return {"max": (2 ** m + top_man) * 2.0 ** (top_exp - bias - m), "smallest_normal": 2.0 ** (1 - bias),
                "smallest_subnormal": 2.0 ** (1 - bias) / 2 ** m, "eps": 1 / 2 ** m}
    assert check_format_facts(facts_by_codes).passed

    grid = torch.tensor(sorted({abs(v) for v in lowp.e4m3.values()}), dtype=torch.float64)  # code i has value i

    def round_by_grid(x):  # nearest grid value, ties to the even code
        a = x.double().abs().clamp(max=448.0)
        hi = torch.searchsorted(grid, a).clamp(max=grid.numel() - 1)
        lo = (hi - 1).clamp(min=0)
        d_lo, d_hi = a - grid[lo], grid[hi] - a
        pick = torch.where(d_lo < d_hi, lo, torch.where(d_hi < d_lo, hi, torch.where(lo % 2 == 0, lo, hi)))
        return torch.copysign(grid[pick], x.double())
    assert check_round_to_e4m3(round_by_grid).passed

    def fp8_by_reshape(x, block):  # no lowp.blocks: reshape and permute, q through the float8 cast
        bm, bk = block
        M, K = x.shape
        if M % bm or K % bk:
            raise ValueError(f"block {block} does not tile {tuple(x.shape)}")
        b = x.double().reshape(M // bm, bm, K // bk, bk)
        s = (b.abs().amax(dim=(1, 3)) / 448).float()
        s = torch.where(s > 0, s, torch.ones_like(s))
        q = (b / s.double()[:, None, :, None]).reshape(M, K).float().to(torch.float8_e4m3fn)
        return q, s
    assert check_quantize_fp8_blockwise(fp8_by_reshape).passed

    def mx_by_frexp(x, elem, block=32):  # floor(log2 amax) from frexp's exponent
        b = x.double().reshape(x.shape[0], -1, block)
        amax = b.abs().amax(-1)
        _, e = torch.frexp(amax)
        exp = torch.where(amax > 0, e.double() - 1 - elem.emax, torch.full_like(amax, -127.0))
        s = torch.pow(2.0, exp)
        return lowp.round_to(b / s[..., None], elem).reshape(x.shape), s
    assert check_mx_quantize(mx_by_frexp).passed

    def nvfp4_by_reshape(x):
        b = x.double().reshape(x.shape[0], -1, 16)
        ts = float(torch.tensor(float(b.abs().max()) / (6 * 448), dtype=torch.float32))
        ts = ts or 1.0
        bs = lowp.round_to(b.abs().amax(-1) / 6 / ts, lowp.e4m3)
        s = (bs * ts)[..., None]
        q = torch.where(s > 0, lowp.round_to(b / torch.where(s > 0, s, torch.ones_like(s)), lowp.e2m1), 0.0)
        return q.reshape(x.shape), bs, ts
    assert check_nvfp4_quantize(nvfp4_by_reshape).passed

    def promoted_by_groups(products, acc_bits, promote_every):  # one group of promote_every products at a time
        p = np.asarray(products, dtype=np.float64)
        total = np.zeros(p.shape[0])
        for start in range(0, p.shape[1], promote_every):
            acc = np.zeros(p.shape[0])
            for k in range(start, min(start + promote_every, p.shape[1])):
                acc = lowp.round_significand(acc + p[:, k], acc_bits)
            total += acc
        return total
    assert check_promoted_sum(promoted_by_groups).passed


def test_library_helpers_that_do_the_exercise_are_refused():
    def via_fake_quantize(x, elem, block=32):  # the library's fake quantization gives q x scale; divide it back
        q, s = mx(x, elem, block)
        lowp.fake_quantize(x, "mxfp4", pad=True)
        return q, s
    with pytest.raises(CheckFailed, match=r"come from common.kernels.lowp.block_scaling.fake_quantize"):
        check_mx_quantize(via_fake_quantize)
    with pytest.raises(CheckFailed, match=r"come from common.kernels.lowp.storage.bytes_per_param"):
        check_bytes_per_param(lambda e, s, b: lowp.bytes_per_param(e, s, b) + 0.0)
    with pytest.raises(CheckFailed, match=r"come from common.kernels.lowp.accuracy.round_significand"):
        check_round_to_e4m3(lambda x: (lowp.round_significand(np.ones(1), 4), round_e4m3(x))[1])
    with pytest.raises(CheckFailed, match=r"never quantized.*; and your code called .*scaled_gemm.quantize_fp8"):
        check_fp8_linear(lambda x, w: (scaled_gemm.quantize_fp8(x, (1, 128)), fp8_linear(x, w, "unquantized"))[1])


def test_the_grader_sees_the_same_library_watch(monkeypatch):
    """Through the grader's wire, what 5.3 hands out (lowp.blocks, round_to) is allowed and lowp.quantize refused."""
    from common.core import checks
    from common.exercises import remote
    monkeypatch.setattr(checks, "submission_hook", remote.loopback_hook)
    assert check_quantize_fp8_blockwise(fp8_blockwise).passed
    with pytest.raises(CheckFailed, match=r"come from common.kernels.lowp.block_scaling.quantize"):
        check_quantize_fp8_blockwise(lambda x, b: (lambda qt: (qt.q, qt.scale))(lowp.quantize(x, lowp.e4m3, b)))

"""The roofline model, costs, roofs and plot (common/kernels/roofline.py)."""
import math

import numpy as np
import pytest

from common.facts import hardware
from common.kernels import roofline as rl


def test_intensity_ridge_attainable_bound():
    assert rl.arithmetic_intensity(100, 50) == 2
    assert rl.ridge_point(1e15, 2.5e12) == 400
    assert rl.attainable(100, 1e15, 2.5e12) == 2.5e14
    assert rl.attainable(1000, 1e15, 2.5e12) == 1e15
    assert rl.attainable(400, 1e15, 2.5e12) == 1e15
    np.testing.assert_allclose(rl.attainable(np.array([1.0, 400, 1e4]), 1e15, 2.5e12), [2.5e12, 1e15, 1e15])
    assert rl.bound(399.9, 1e15, 2.5e12) == "memory-bound"
    assert rl.bound(400, 1e15, 2.5e12) == "compute-bound"
    assert rl.fraction_of_attainable(1e12, 1e10, 0.01, 1e15, 2.5e12) == pytest.approx(1e14 / 2.5e14)


@pytest.mark.parametrize("call,match", [
    (lambda: rl.arithmetic_intensity(10, 0), "bytes_moved=0"),
    (lambda: rl.arithmetic_intensity(-1, 10), "flops=-1"),
    (lambda: rl.ridge_point(1e15, -3), "bandwidth=-3"),
    (lambda: rl.attainable(-1, 1e15, 1e12), "intensity"),
    (lambda: rl.attainable(float("nan"), 1e15, 1e12), "intensity"),
    (lambda: rl.gemm_cost(0, 4, 4), "m=0"),
    (lambda: rl.gemm_cost(4, 4.5, 4), "n=4.5"),
    (lambda: rl.softmax_cost(4, 4, "int3"), "dtype='int3'"),
    (lambda: rl.Roof("x", 0, 1e12), "peak_flops=0"),
    (lambda: rl.Roof("x", 1e12, 1e12, kind="guess"), "kind='guess'"),
    (lambda: rl.plot([]), "ceilings is empty"),
    (lambda: rl.plot([1e15]), "Roof objects"),
])
def test_bad_input_names_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_costs():
    assert tuple(rl.vector_add_cost(10, "fp32")) == (10, 120)
    assert tuple(rl.gemm_cost(2, 3, 4, "bf16")) == (48, (8 + 12 + 6) * 2)
    assert tuple(rl.softmax_cost(3, 5, "fp32")) == (75, 120)
    assert tuple(rl.layernorm_cost(3, 5, "bf16")) == (120, (30 + 10) * 2)
    c = rl.attention_cost(2, 4, 16, 8, "bf16")
    assert c.flops == 8 * (4 * 16 * 16 * 8 + 5 * 16 * 16)
    assert c.bytes == 8 * (4 * 16 * 8 + 4 * 16 * 16) * 2
    assert rl.gemm_cost(4096, 4096, 4096, "bf16").intensity == pytest.approx(4096 / 3)
    # matrix-vector: about 1 FLOP per byte in bf16
    assert rl.gemm_cost(1, 8192, 8192, "bf16").intensity == pytest.approx(1.0, rel=1e-3)
    assert rl.dtype_bytes("torch.bfloat16") == 2 and rl.dtype_bytes("fp4") == 0.5


def test_decode_intensity_grows_with_batch_and_saturates():
    xs = [rl.decode_gemm_intensity(b, 8192, 8192, "bf16") for b in (1, 2, 4, 64, 1024, 10**6)]
    assert all(a < b for a, b in zip(xs, xs[1:]))
    assert xs[0] == pytest.approx(1.0, rel=1e-3)
    assert xs[-1] < 8192 * 8192 / (8192 + 8192)


@pytest.mark.parametrize("gid", hardware.gpu_ids())
def test_critical_batch_is_the_first_compute_bound_batch(gid):
    roof = rl.Roof.datasheet(gid, "bf16")
    b = rl.critical_batch(roof.peak_flops, roof.bandwidth)
    assert rl.decode_gemm_intensity(b, 8192, 8192) >= roof.ridge
    assert rl.decode_gemm_intensity(b - 1, 8192, 8192) < roof.ridge
    assert b > roof.ridge  # the activations' bytes push it above the weights-only estimate


def test_critical_batch_h100_and_h800_equal():
    a, b = (rl.Roof.datasheet(g, "bf16") for g in ("H100-SXM", "H800-SXM"))
    assert rl.critical_batch(a.peak_flops, a.bandwidth) == rl.critical_batch(b.peak_flops, b.bandwidth) == 319


def test_critical_batch_unreachable():
    with pytest.raises(ValueError, match="no batch makes"):
        rl.critical_batch(1e15, 1e12, k=256, n=256)


def test_datasheet_roof():
    r = rl.Roof.datasheet("H100-SXM", "bf16")
    assert r.peak_flops == pytest.approx(989.5e12) and r.bandwidth == pytest.approx(3.35e12)
    assert r.ridge == pytest.approx(hardware.ridge_point("H100-SXM", "bf16"))
    assert rl.Roof.datasheet("H100-SXM", "bf16", sparse=True).ridge == pytest.approx(2 * r.ridge)
    with pytest.raises(hardware.UnsupportedDtype):
        rl.Roof.datasheet("H100-SXM", "fp4")
    with pytest.raises(hardware.UnknownHardware, match="closest match"):
        rl.Roof.datasheet("H10", "bf16")
    assert [x.name.split()[1] for x in rl.gpu_roofs("A100-SXM")] == ["fp64", "tf32", "bf16"]


def test_measured_roof_uses_common_ceilings():
    r = rl.Roof.measured(copy_bytes=2**22, matmul_n=128, device="cpu", min_run_time=0.01)
    assert r.kind == "measured" and r.peak_flops > 1e6 and r.bandwidth > 1e6
    assert math.isfinite(r.ridge) and r.ridge > 0


def test_point_and_plot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    roofs = rl.gpu_roofs("H100-SXM") + [rl.Roof("measured", 1e11, 2e10, kind="measured")]
    pts = [rl.Point.from_cost("gemm", rl.gemm_cost(512, 512, 512, "fp32"), seconds=0.01),
           ("vector add", 1 / 12), {"label": "softmax", "intensity": 0.6, "flops_per_s": 1e9}]
    ax = rl.plot(ceilings=roofs, points=pts, title="t")
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["gemm", "vector add", "softmax"]
    assert len(ax.get_legend().get_texts()) == len(roofs)
    plt.close(ax.figure)
    fig = rl.plot_side_by_side(rl.gpu_roofs("H100-SXM", ["bf16"]), [roofs[-1]], pts)
    assert len(fig.axes) == 2
    plt.close(fig)
    with pytest.raises(ValueError, match="not a Point"):
        rl.plot(roofs, ["gemm"])


def test_prediction_placed_on_the_chosen_roof_not_the_highest():
    """Issue 18 #3: a bf16 decode point on a GPU with fp4 roofs sits on the bf16 roof."""
    import matplotlib
    matplotlib.use("Agg")
    roofs = rl.gpu_roofs("B200")
    bf16 = rl.Roof.datasheet("B200", "bf16")
    cost = rl.gemm_cost(873, 8192, 8192, "bf16")
    ax = rl.plot(roofs, [("decode", cost.intensity)], place_on=bf16)
    marker = [ln for ln in ax.lines if ln.get_marker() == "o" and ln.get_mfc() == "none"][0]
    scale, _ = rl._unit(max(r.peak_flops for r in roofs))
    assert marker.get_ydata()[0] * scale == pytest.approx(bf16.attainable(cost.intensity))
    assert marker.get_ydata()[0] * scale < max(r.attainable(cost.intensity) for r in roofs)
    with pytest.raises(ValueError, match="place_on must be a Roof"):
        rl.plot(roofs, [("decode", 1.0)], place_on="bf16")


def test_close_labels_do_not_overlap():
    """Issue 18 #7: labels of points close together get different offsets."""
    import matplotlib
    matplotlib.use("Agg")
    ax = rl.plot([rl.Roof("m", 1e11, 2e10, kind="measured")], [("a", 0.1, 1e9), ("b", 0.11, 1.05e9), ("c", 100, 5e10)])
    offsets = [t.xyann for t in ax.texts]
    assert offsets[0] != offsets[1] and offsets[2] == offsets[0]


def test_op_cost_and_predict_op():
    """The predictor the lab's build exercise asks for: each operation's cost by its shape, the roof's verdict."""
    assert rl.op_cost("gemm", (2, 3, 4), "fp32") == rl.gemm_cost(2, 3, 4, "fp32")
    assert rl.op_cost("vector_add", 10, "bf16") == rl.vector_add_cost(10, "bf16")
    p = rl.predict_op("softmax", (4096, 4096), "bf16", 989.5e12, 3.35e12)
    assert p["bound"] == "memory-bound" and p["intensity"] == 1.25
    assert p["attainable"] == pytest.approx(1.25 * 3.35e12) and p["seconds"] == pytest.approx(p["bytes"] / 3.35e12)
    g = rl.predict_op("gemm", (4096, 4096, 4096), "bf16", 989.5e12, 3.35e12)
    assert g["bound"] == "compute-bound" and g["seconds"] == pytest.approx(g["flops"] / 989.5e12)
    with pytest.raises(ValueError, match="op='conv'.*allowed: vector_add, gemm"):
        rl.op_cost("conv", (1, 2), "bf16")
    with pytest.raises(ValueError, match=r"shape=\(1, 2\) for attention must be \(batch, heads, seq, head_dim\)"):
        rl.op_cost("attention", (1, 2), "bf16")

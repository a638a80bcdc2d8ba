"""common.kernels.scaled_gemm: FP8 quantization for _scaled_mm, per-tensor and fine-grained GEMMs, error against K."""
import pytest
import torch

from common.kernels import lowp
from common.kernels import scaled_gemm as sg

pytestmark = pytest.mark.usefixtures("one_thread")


def test_quantize_fp8_round_trip_and_zero_block():
    x = lowp.make_activations(4, 512, seed=3)
    x[1, 128:256] = 0  # an all-zero tile: scale 1, q 0, never NaN
    q, s = sg.quantize_fp8(x, sg.ACTIVATION_TILE)
    assert q.dtype == torch.float8_e4m3fn and tuple(s.shape) == (4, 4) and s.dtype == torch.float32
    assert float(s[1, 1]) == 1.0 and torch.isfinite(s).all()
    back = sg.dequantize_fp8(q, s, sg.ACTIVATION_TILE)
    assert torch.isfinite(back).all() and float(back[1, 128:256].abs().max()) == 0
    assert lowp.rel_error(x, back) < 0.04
    # the same values as lowp's reference quantizer
    ref = lowp.quantize(x, lowp.e4m3, (1, 128), "fp32")
    assert torch.equal(back, lowp.dequantize(ref, torch.float64))


def test_quantize_fp8_refuses_bad_blocks():
    with pytest.raises(ValueError, match="does not tile"):
        sg.quantize_fp8(torch.ones(4, 200), (1, 128))
    with pytest.raises(ValueError, match="2-D"):
        sg.quantize_fp8(torch.ones(4, 2, 128), (1, 128))
    with pytest.raises(ValueError, match="non-finite"):
        sg.quantize_fp8(torch.tensor([[1.0, float("nan")]]))


def test_scaled_mm_runs_on_this_cpu_and_matches_the_dequantized_product():
    x, w = lowp.make_activations(8, 512, seed=0), lowp.make_weights(256, 512, seed=1)
    xq, xs = sg.quantize_fp8(x)
    wq, ws = sg.quantize_fp8(w)
    exact = sg.dequantize_fp8(xq, xs) @ sg.dequantize_fp8(wq, ws).T
    y = sg.scaled_mm_per_tensor(xq, xs, wq, ws)
    assert y.dtype == torch.float32 and lowp.rel_error(exact, y) < 1e-5
    fq, fs = sg.quantize_fp8(x, sg.ACTIVATION_TILE)
    gq, gs = sg.quantize_fp8(w, sg.WEIGHT_BLOCK)
    y = sg.scaled_mm_fine_grained(fq, fs, gq, gs)
    exact = sg.dequantize_fp8(fq, fs, sg.ACTIVATION_TILE) @ sg.dequantize_fp8(gq, gs, sg.WEIGHT_BLOCK).T
    assert lowp.rel_error(exact, y) < 1e-5
    with pytest.raises(ValueError, match="scales"):
        sg.scaled_mm_fine_grained(fq, fs.T.contiguous(), gq, gs)
    with pytest.raises(ValueError, match="float8"):
        sg.scaled_mm_per_tensor(x, xs, wq, ws)


def test_native_blockwise_refused_on_cpu_with_a_reason():
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    xq, xs = sg.quantize_fp8(torch.randn(128, 256), sg.ACTIVATION_TILE)
    wq, ws = sg.quantize_fp8(torch.randn(128, 256), sg.WEIGHT_BLOCK)
    with pytest.raises(RuntimeError, match="blockwise _scaled_mm unavailable"):
        sg.scaled_mm_blockwise_native(xq, xs, wq, ws)


def test_error_vs_k_accumulation_model_grows_and_promotion_caps_it():
    rows = sg.error_vs_k([256, 2048], M=4, N=128, model_outputs=16)
    small, big = rows
    # FP8 quantization error: a few percent at every K, E4M3 rounding itself
    for r in rows:
        assert 0.01 < r["total_per_tensor"] < 0.06 and 0.01 < r["total_fine_grained"] < 0.06
        assert r["accum_per_tensor"] < 1e-5  # this CPU sums in FP32
    assert big["model_no_promotion"] > 3 * small["model_no_promotion"]
    assert big["model_promote_128"] < 2 * small["model_promote_128"]


def test_time_gemms_on_cpu_reports_ratios():
    r = sg.time_gemms(64, 128, 256, "cpu", min_run_time=0.01)
    assert r["bf16_tflops"] > 0 and r["fp8_tensor_tflops"] > 0 and "fp8_blockwise_tflops" not in r
    assert r["fp8_tensor_vs_bf16"] == pytest.approx(r["fp8_tensor_tflops"] / r["bf16_tflops"])
    assert sg.gemm_flops(2, 3, 4) == 48


def test_lowp_bench_writes_its_table(tmp_path, capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "lowp_bench.py"
    spec = importlib.util.spec_from_file_location("lowp_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from common.core import env
    saved = env._current  # the benchmark calls setup(); leave the process's environment as it was
    try:
        assert bench.main(["--shapes", "32x128x128", "--min-run-time", "0.01", "--out", str(tmp_path)]) == 0
    finally:
        env._current = saved
    out = capsys.readouterr().out
    if not torch.cuda.is_available():
        assert "not FP8 performance" in out
    csv = (tmp_path / "lowp_bench.csv").read_text()
    assert "bf16_tflops" in csv and "fp8_tensor_fast_vs_bf16" in csv
    assert (tmp_path / "lowp_bench_table.txt").exists()
    with pytest.raises(SystemExit, match="MxNxK"):
        bench.main(["--shapes", "32x128"])

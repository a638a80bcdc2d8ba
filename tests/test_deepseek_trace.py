"""DeepSeek's trace, read (common.systems.v3.trace): classes, figures from a synthetic trace of the same format,
clear errors, the derivation script, and the committed figures' consistency. No test needs the original train.json."""
import json
import subprocess
import sys

import pytest

from common.core.env import REPO_ROOT
from common.systems.v3 import trace as dt
from tests import synthetic_trace as st


@pytest.mark.parametrize("name, cls", [
    ("void dpsk::ep::internode::cached_notify<false>(int, int)", "deepep_notify"),
    ("void dpsk::ep::internode::notify_dispatch<false, 8>(int const*)", "deepep_notify"),
    ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*)", "deepep_dispatch"),
    ("void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*)", "deepep_dispatch"),
    ("void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*)", "deepep_combine"),
    ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::m_grouped_fp8_ptp128c::GemmKernel>(Params)",
     "grouped_gemm"),
    ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_dptp128c_acc::GemmKernel>(Params)", "fp8_gemm"),
    ("sm90_xmma_gemm_bf16f32_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
     "bf16_gemm"),
    ("void cutlass::device_kernel<flash::FlashAttnBwdPreprocess<cute::tuple<cute::C<64>>>>", "attention_bwd"),
    ("void flash::compute_attn_ws<Flash_fwd_kernel_traits<192, 128, 128, 12, 2>>", "attention_fwd"),
    ("void dpsk::grouped_gemm::cuda::utils::transpose<512, 128, 4, 4>(unsigned char const*)", "quantize"),
    ("void cuda::per_channel_cast_and_transpose<256, 128, true>(void const*)", "quantize"),
    ("void layer_norm::ln_bwd_kernel<layer_norm::Kernel_traits<__nv_bfloat16>>", "norm"),
    ("cuda::expand_to_fused_with_scales_impl(int4 const*, int4*)", "permute"),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>", "permute"),
    ("void cuda::swiglu_forward_backward_with_weight_impl<__nv_bfloat16>", "elementwise"),
    ("rotary_kernel", "elementwise"),
    ("dpsk::grouped_gemm::cuda::utils::fill_tensormaps_kernel(CUtensorMap_st)", "other"),
])
def test_classify(name, cls):
    assert dt.classify(name) == cls
    assert cls in dt.CLASSES


def test_summarize_a_synthetic_trace(tmp_path):
    fig = dt.summarize(st.write(tmp_path / "t.json"))
    assert fig["source"]["repository"] == "deepseek-ai/profile-data" and fig["source"]["commit"] == "4496024"
    assert fig["step"]["gpu_ms"] == pytest.approx(st.EXPECTED["gpu_ms"])
    assert fig["step"]["host_ms"] == pytest.approx(st.EXPECTED["host_ms"])
    for k in ("compute_busy_ms", "comm_busy_ms", "overlap_ms", "exposed_comm_ms", "idle_ms", "gemm_busy_ms"):
        assert fig["overlap"][k] == pytest.approx(st.EXPECTED[k]), k
    assert dt.exposed_comm_share(fig) == pytest.approx(0.03 / 0.52)
    assert dt.gemm_share(fig) == pytest.approx(0.28 / 0.52)
    assert dt.idle_share(fig) == pytest.approx(0.0)
    assert dt.stream_busy_ms(fig) == {"7": pytest.approx(0.47), "23": pytest.approx(0.06), "27": pytest.approx(0.37)}
    ph = dt.phases(fig)
    assert set(ph) == {p[0] for p in st.PHASES}
    assert ph["mlp(W)"]["busy_ms"] == pytest.approx(0.07) and ph["mlp(W)"]["classes"] == {"fp8_gemm": 0.11}
    assert ph["dispatch(F)"]["host_ms"] == pytest.approx(0.2)
    shares = dt.class_shares(fig)
    assert shares["grouped_gemm"] == pytest.approx(0.15 / 0.52, abs=1e-4)
    assert sum(v["kernels"] for v in fig["classes"].values()) == fig["step"]["kernels"] == 14
    # the transfer kernels alone (notify left out), the exposed stretches (none of 50 us here: 10 + 20 us), grids
    assert dt.transfer_busy_ms(fig) == pytest.approx(0.28)
    assert dt.exposed_gaps(fig) == [] and fig["overlap"]["exposed_short_ms"] == pytest.approx(0.03)
    assert dt.grids(fig) == {"attention_bwd": {112: 1}, "attention_fwd": {112: 1}, "deepep_combine": {112: 1},
                             "deepep_dispatch": {112: 2}, "deepep_notify": {112: 2}, "fp8_gemm": {112: 3},
                             "grouped_gemm": {112: 1}}
    tl = dt.timeline(fig)
    assert ("23", "mlp(W)", 0, pytest.approx(0.36), pytest.approx(0.42), pytest.approx(0.06)) in tl
    gk = dt.gemm_kernels(fig)
    assert gk["attn(F)"] == [("fp8_gemm", "7", 0.06), ("attention_fwd", "7", 0.1)]
    assert json.loads(json.dumps(fig)) == fig          # figures only, plain JSON


def test_summarize_errors(tmp_path):
    data = st.trace()
    no_step = dict(data, traceEvents=[e for e in data["traceEvents"] if e.get("name") != "ProfilerStep#1"])
    with pytest.raises(ValueError, match="no 'ProfilerStep#1' range"):
        dt.summarize(st.write(tmp_path / "a.json", no_step))
    keep = {"ProfilerStep#1", "1F1B"}
    no_ann = dict(data, traceEvents=[e for e in data["traceEvents"]
                                     if e.get("cat") != "user_annotation" or e["name"] in keep])
    with pytest.raises(ValueError, match="no user_annotation ranges"):
        dt.summarize(st.write(tmp_path / "b.json", no_ann))
    no_kernels = dict(data, traceEvents=[e for e in data["traceEvents"] if e.get("cat") != "kernel"])
    with pytest.raises(ValueError, match="no kernel events"):
        dt.summarize(st.write(tmp_path / "c.json", no_kernels))
    no_corr = dict(data, traceEvents=[e for e in data["traceEvents"] if e.get("cat") != "cuda_runtime"])
    with pytest.raises(ValueError, match="no 'correlation' ids"):
        dt.summarize(st.write(tmp_path / "d.json", no_corr))
    (tmp_path / "e.json").write_text(json.dumps(data)[:500])
    with pytest.raises(ValueError, match="truncated"):
        dt.summarize(tmp_path / "e.json")


def test_the_script_derives_the_figures(tmp_path):
    src, out = st.write(tmp_path / "train.json"), tmp_path / "figures.json"
    run = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "derive_deepseek_profile.py"), src, str(out)],
                         capture_output=True, text=True, cwd=REPO_ROOT)
    assert run.returncode == 0, run.stderr
    assert "step 0.5 ms on the GPU" in run.stdout
    assert dt.load_profile(out) == dt.summarize(src)
    bad = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "derive_deepseek_profile.py")],
                         capture_output=True, text=True, cwd=REPO_ROOT)
    assert bad.returncode == 2 and "derive_deepseek_profile.py" in bad.stderr
    with pytest.raises(FileNotFoundError, match="derive_deepseek_profile.py"):
        dt.load_profile(tmp_path / "nope.json")


def test_committed_figures_are_consistent():
    prof = dt.load_profile()
    assert prof["source"] == dt.SOURCE and prof["trace"]["device"] == "NVIDIA H800"
    s, o = prof["step"], prof["overlap"]
    assert 100 < s["gpu_ms"] < 150 and s["host_ms"] < s["gpu_ms"]
    assert o["overlap_ms"] <= min(o["compute_busy_ms"], o["comm_busy_ms"])
    assert o["exposed_comm_ms"] == pytest.approx(o["comm_busy_ms"] - o["overlap_ms"], abs=2e-3)
    assert 0 <= dt.exposed_comm_share(prof) < 0.1 and 0 <= dt.idle_share(prof) < 0.05
    ph = dt.phases(prof)
    assert all(ph[p]["count"] == 4 for p in dt.COMPUTE_PHASES + dt.COMM_PHASES)   # 4 MoE layers per chunk
    compute = sum(ph[p]["busy_ms"] for p in dt.COMPUTE_PHASES)
    assert compute == pytest.approx(o["compute_busy_ms"], rel=0.02)
    assert {r[0] for r in dt.timeline(prof)} == {"7", "23", "27"}
    # the exposed stretches and the short rest add up to the exposed communication; DeepEP on 20 SMs, GEMMs on 112
    long = sum(b - a for a, b in dt.exposed_gaps(prof))
    assert long + o["exposed_short_ms"] == pytest.approx(o["exposed_comm_ms"], abs=2e-3)
    assert o["transfer_busy_ms"] < o["comm_busy_ms"]
    g = dt.grids(prof)
    assert set(g["fp8_gemm"]) == set(g["grouped_gemm"]) == {112} and max(g["deepep_combine"]) == 20

"""Published GPU figures of what the labs measure here, for the claims a run prints (`common.core.claims`).

    figure("liger.rmsnorm_fused_vs_eager")  -> Published(10.5, "x", "H100 NVL", "a fused Triton RMSNorm ...", source)

The raw numbers live in data/ with their sources (data/published_gpu.json, data/hardware.json's datasheets,
data/kernel_rates.json's DeepGEMM and FlashAttention-3 rates, data/comm_measured.json's NCCL and DeepEP bandwidths,
data/deepseek_profile_train.json's figures of DeepSeek's own H800 trace); the comparisons are computed here, once, so
a claim never carries a number nobody published. `names()` lists them.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Callable

from common.core.claims import Published
from common.facts import hardware
from common.facts.sourced import FactFile

DATA = Path(__file__).resolve().parents[2] / "data"
GPU_FILE = FactFile(DATA / "published_gpu.json")
SERVICE_FILE = FactFile(DATA / "deepseek_v3_service.json")  # DeepSeek's service and kernel figures (lab 14)


def _fact(name: str) -> float:
    return GPU_FILE.fact(name)


def _source(name: str) -> str:
    """'title (url, date)' of the source fact `name` of data/published_gpu.json cites."""
    src = GPU_FILE.data["sources"][GPU_FILE.data["facts"][name]["source"]]
    return f"{src['title']} ({src['url']}, {src['date']})"


def _datasheet(gpu_id: str, field: str) -> str:
    src = hardware.source(gpu_id, field)
    return f"{src['title']} ({src['url']}, {src['date']})"


@lru_cache(maxsize=1)
def _kernel_rates() -> dict:
    return json.loads((DATA / "kernel_rates.json").read_text())


def _rates_source(key: str) -> str:
    src = _kernel_rates()["sources"][key]
    return f"{src['title']} ({src['url']}, {src['date']})"


def _liger_bytes() -> float:
    """Bytes a fused RMSNorm forward moves at least: read x, write y (bf16), read the weight."""
    rows, hidden = _fact("liger.rmsnorm.rows"), _fact("liger.rmsnorm.hidden")
    return (2 * rows * hidden + hidden) * 2


@lru_cache(maxsize=None)
def _data(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def _comm(key: str, what: str = "") -> Published:
    """A measured bandwidth of data/comm_measured.json (NCCL's all-reduce busbw, DeepEP's dispatch and combine)."""
    data = _data("comm_measured.json")
    m, src = data["measurements"][key], data["sources"][data["measurements"][key]["source"]]
    span = f" ({m['value_low']:g}-{m['value_high']:g} GB/s)" if "value_high" in m else ""
    return Published(m.get("value_low", m.get("value")), "GB/s", hardware.gpu(m["gpu"]).name,
                     f"{what or m['conditions']}{span}", f"{src['title']} ({src['url']}, {src['date']})")


def _fb_comm_hidden() -> Published:
    """The share of communication time that overlaps compute in DeepSeek's trace of one DualPipe F&B pair."""
    data = _data("deepseek_profile_train.json")
    o, src = data["overlap"], data["sources"]["profile_data"]
    return Published(100 * o["overlap_ms"] / o["comm_busy_ms"], "% of communication time hidden behind compute",
                     data["trace"]["device"].replace("NVIDIA ", ""), f"DeepSeek's trace of one DualPipe forward + "
                     f"backward chunk pair (EP{data['trace']['world_size']}, rank {data['trace']['rank']}): "
                     f"{o['overlap_ms']:.1f} of {o['comm_busy_ms']:.1f} ms of DeepEP's communication kernels ran beside compute "
                     f"kernels, {o['exposed_comm_ms']:.1f} ms exposed", f"{src['title']} ({src['url']}, {src['date']})")


def _h100_hbm() -> Published:
    return Published(hardware.gpu("H100-SXM").hbm_bandwidth_tbs, "TB/s", "H100 SXM", "HBM3 bandwidth, datasheet peak",
                     _datasheet("H100-SXM", "hbm_bandwidth_tbs"))


def _h100_bf16() -> Published:
    return Published(hardware.peak_tflops("H100-SXM", "bf16"), "TFLOP/s", "H100 SXM", "bf16 tensor cores, dense, "
                     "datasheet peak", _datasheet("H100-SXM", "tflops"))


def _deepgemm_best() -> Published:
    table = _kernel_rates()["deepgemm_fp8"]["normal"]
    m, n, k, tflops = max(table, key=lambda row: row[3])[:4]
    peak = hardware.peak_tflops("H800-SXM", "fp8")
    return Published(100 * tflops / peak, "% of the dense FP8 peak", "H800 SXM",
                     f"DeepGEMM's fastest FP8 GEMM of its table, {m} x {n} x {k}: {tflops:,} of {peak:,.0f} TFLOP/s",
                     _rates_source("deepgemm_a6d97a1"))


def _deepgemm_over_bf16() -> Published:
    table = _kernel_rates()["deepgemm_fp8"]["normal"]
    m, n, k, tflops = max(table, key=lambda row: row[3])[:4]
    bf16 = hardware.peak_tflops("H800-SXM", "bf16")
    return Published(tflops / bf16, "x", "H800 SXM", f"DeepGEMM's fastest FP8 GEMM ({m} x {n} x {k}, 1x128 / 128x128 "
                     f"scales, promoted in FP32): {tflops:,} TFLOP/s, over the {bf16:,} TFLOP/s dense BF16 peak",
                     f"{_rates_source('deepgemm_a6d97a1')}; {_datasheet('H800-SXM', 'tflops')}")


def _deepgemm_grouped_vs_dense() -> Published:
    """DeepGEMM's grouped (contiguous-layout) FP8 GEMM over experts against its dense GEMM of the same N and K."""
    rates = _kernel_rates()["deepgemm_fp8"]
    groups, m, n, k, grouped = rates["grouped_contiguous"][0][:5]
    dense = next(row[3] for row in rates["normal"] if row[1] == n and row[2] == k and row[0] == 4096)
    return Published(grouped / dense, "x", "H800 SXM", f"DeepGEMM's grouped FP8 GEMM, {groups} experts x {m:,} rows, "
                     f"N = {n:,}, K = {k:,}: {grouped:,} TFLOP/s, against its dense 4096 x {n:,} x {k:,} GEMM at "
                     f"{dense:,}: experts sorted into contiguous slices run as fast as one big GEMM",
                     _rates_source("deepgemm_a6d97a1"))


def _deepgemm_grouped() -> Published:
    table = _kernel_rates()["deepgemm_fp8"]["grouped_contiguous"]
    groups, m, n, k, tflops = max(table, key=lambda row: row[4])[:5]
    peak = hardware.peak_tflops("H800-SXM", "fp8")
    return Published(100 * tflops / peak, "% of the dense FP8 peak", "H800 SXM",
                     f"DeepGEMM's grouped FP8 GEMM for MoE experts (contiguous layout, training), {groups} groups of "
                     f"{m:,} rows, {n} x {k}: {tflops:,} of {peak:,.0f} TFLOP/s", _rates_source("deepgemm_a6d97a1"))


@lru_cache(maxsize=1)
def _deepseek_trace() -> dict:
    return json.loads((DATA / "deepseek_profile_train.json").read_text())


def _deepseek(what: str, value: Callable[[dict], float], unit: str) -> Published:
    prof = _deepseek_trace()
    src = prof["sources"]["profile_data"]
    return Published(value(prof), unit, "H800 SXM", f"{what} (DeepSeek's own PyTorch-profiler trace of one DualPipe "
                     f"step, rank 0 of 64)", f"{src['title']} ({src['url']}, {src['date']})")


def _fa3_forward() -> Published:
    fa3 = _kernel_rates()["flash_attention_3"]
    tflops = fa3["forward"]["noncausal"]["128"][-1]
    peak = hardware.peak_tflops("H100-SXM", "bf16")
    return Published(100 * tflops / peak, "% of the dense bf16 peak", "H100 SXM",
                     f"FlashAttention-3 forward, head dim 128, {fa3['seqlens'][-1]:,} tokens: {tflops} of {peak} TFLOP/s",
                     _rates_source("fa3_paper"))


def _fa3_over_standard(n: int = 4096, d: int = 128) -> Published:
    """FlashAttention-3's forward against the fastest standard attention (Algorithm 0: S and P written to HBM and
    read back, 2 (4 N d + 4 N^2) bytes per head in bf16) could run on the same H100: its HBM-roofline bound."""
    fa3 = _kernel_rates()["flash_attention_3"]
    tflops = fa3["forward"]["noncausal"][str(d)][fa3["seqlens"].index(n)]
    bw = hardware.gpu("H100-SXM").hbm_bandwidth_tbs * 1e12
    peak = hardware.peak_tflops("H100-SXM", "bf16") * 1e12
    flops, nbytes = 4 * n * n * d, 2 * (4 * n * d + 4 * n * n)
    bound = min(peak, flops / nbytes * bw) / 1e12
    return Published(tflops / bound, "x", "H100 SXM",
                     f"FlashAttention-3 forward ({tflops} TFLOP/s, N = {n:,}, d = {d}, bf16) over the most standard "
                     f"attention can reach when S and P go through HBM ({bound:.0f} TFLOP/s: {flops / nbytes:.0f} "
                     f"FLOP/B x {bw / 1e12:.2f} TB/s, datasheet)",
                     f"{_rates_source('fa3_paper')}; {_datasheet('H100-SXM', 'hbm_bandwidth_tbs')}")


def _fa3_backward(d: int = 128) -> Published:
    fa3 = _kernel_rates()["flash_attention_3"]
    tflops = fa3["backward"]["noncausal"][str(d)][-1]
    peak = hardware.peak_tflops("H100-SXM", "bf16")
    return Published(tflops, "TFLOP/s", "H100 SXM", f"FlashAttention-3 backward, head dim {d}, {fa3['seqlens'][-1]:,} "
                     f"tokens, bf16: {100 * tflops / peak:.0f}% of the {peak} TFLOP/s dense peak (FLOPs counted as "
                     f"2.5x the forward's)", _rates_source("fa3_paper"))


def _liger(key: str, over: str, what: str) -> Published:
    return Published(_fact(f"liger.rmsnorm_fwd_ms.{over}") / _fact(f"liger.rmsnorm_fwd_ms.{key}"), "x", "H100 NVL",
                     what, _source("liger.rmsnorm_fwd_ms.liger"))


def _liger_hbm_fraction() -> Published:
    achieved = _liger_bytes() / (_fact("liger.rmsnorm_fwd_ms.liger") * 1e-3)
    peak = hardware.gpu_variant("H100-NVL")["hbm_bandwidth_tbs"] * 1e12
    return Published(100 * achieved / peak, "% of HBM bandwidth", "H100 NVL",
                     f"Liger's fused RMSNorm forward, 2048 x 4096 bf16: {achieved / 1e12:.2f} of {peak / 1e12:.1f} TB/s "
                     f"moved (read x, write y)", _source("liger.rmsnorm_fwd_ms.liger"))


def _flashmla_hbm_fraction() -> Published:
    gbs, peak = SERVICE_FILE.fact("flashmla_memory_bound_gbs"), hardware.gpu("H800-SXM").hbm_bandwidth_tbs * 1e3
    return Published(100 * gbs / peak, "% of HBM bandwidth", "H800 SXM", f"FlashMLA's dense MLA decode (64 query rows "
                     f"per block, the KV counted once), memory-bound setting: {gbs:,} of {peak:,.0f} GB/s",
                     SERVICE_FILE.source("flashmla_memory_bound_gbs"))


def _decode_requests_per_gpu() -> Published:
    f = SERVICE_FILE.fact
    per_user = (f("output_tokens_per_s_per_user_low") + f("output_tokens_per_s_per_user_high")) / 2
    per_gpu = f("decode_tokens_per_s_per_node") / f("gpus_per_node")
    return Published(per_gpu / per_user, "requests per GPU", "H800 SXM", f"DeepSeek's decode service: "
                     f"{per_gpu:,.0f} output tokens/s per GPU at {per_user:g} tokens/s per user -- the batch one "
                     f"GPU's step serves", SERVICE_FILE.source("decode_tokens_per_s_per_node"))


_FIGURES: dict[str, Callable[[], Published]] = {
    "h100.hbm_bandwidth": _h100_hbm,
    "h100.bf16_dense_peak": _h100_bf16,
    "deepgemm.fp8_best_fraction_of_peak": _deepgemm_best,
    "deepgemm.grouped_fraction_of_peak": _deepgemm_grouped,
    "deepseek.h800_idle_share": lambda: _deepseek(
        "share of the training step in which no kernel runs on any stream",
        lambda p: 100 * p["overlap"]["idle_ms"] / p["step"]["gpu_ms"], "% of the step"),
    "deepseek.h800_exposed_comm_share": lambda: _deepseek(
        "share of the step in which DeepEP's all-to-all runs with no compute beside it",
        lambda p: 100 * p["overlap"]["exposed_comm_ms"] / p["step"]["gpu_ms"], "% of the step"),
    "deepgemm.fp8_over_bf16_peak": _deepgemm_over_bf16,
    "deepgemm.grouped_vs_dense": _deepgemm_grouped_vs_dense,
    "deepseek.fp8_accumulation_error": lambda: Published(
        100 * _fact("deepseek.fp8_accumulation_max_rel_error_k4096"), "% maximum relative error", "H800 SXM",
        "an FP8 GEMM at K = 4,096 accumulated in the tensor cores' limited precision (about 14 bits), before "
        "DeepSeek's promotion to FP32 every 128 elements (the report: 'nearly 2%')",
        _source("deepseek.fp8_accumulation_max_rel_error_k4096")),
    "fa3.forward_fraction_of_peak": _fa3_forward,
    "fa3.over_standard_attention_bound": _fa3_over_standard,
    "fa3.backward_tflops": _fa3_backward,
    "liger.rmsnorm_fused_vs_eager": lambda: _liger(
        "liger", "huggingface", "a fused Triton RMSNorm forward vs eager PyTorch (one kernel per op), 2048 x 4096 bf16"),
    "liger.rmsnorm_fused_vs_compile": lambda: _liger(
        "liger", "torchcompile", "a fused Triton RMSNorm forward vs torch.compile of the eager module, same shape"),
    "liger.rmsnorm_compile_vs_eager": lambda: _liger(
        "torchcompile", "huggingface", "torch.compile of an eager RMSNorm vs eager, 2048 x 4096 bf16"),
    "liger.rmsnorm_fraction_of_hbm": _liger_hbm_fraction,
    "pytorch2.inference_speedup": lambda: Published(
        _fact("pytorch2.inductor_inference_speedup"), "x", "A100", "torch.compile (TorchInductor) vs eager, geometric "
        "mean over 180+ models, inference", _source("pytorch2.inductor_inference_speedup")),
    "pytorch2.training_speedup": lambda: Published(
        _fact("pytorch2.inductor_training_speedup"), "x", "A100", "torch.compile (TorchInductor) vs eager, geometric "
        "mean over 180+ models, training", _source("pytorch2.inductor_training_speedup")),
    "fa3.forward_fp16_utilization": lambda: Published(
        100 * _fact("fa3.fp16_utilization"), "% of the dense FP16 peak", "H100 SXM",
        f"FlashAttention-3 forward, up to {_fact('fa3.fp16_tflops_max'):.0f} TFLOP/s", _source("fa3.fp16_utilization")),
    "fa3.speedup_over_fa2": lambda: Published(
        _fact("fa3.speedup_over_fa2_high"), "x", "H100 SXM", f"FlashAttention-3 over FlashAttention-2, FP16 (the paper: "
        f"{_fact('fa3.speedup_over_fa2_low')}-{_fact('fa3.speedup_over_fa2_high')}x)", _source("fa3.speedup_over_fa2_high")),
    "fa3.fp8_pflops": lambda: Published(
        _fact("fa3.fp8_pflops"), "PFLOP/s", "H100 SXM", "FlashAttention-3 forward in FP8", _source("fa3.fp8_pflops")),
    "fa3.fp8_error_vs_baseline": lambda: Published(
        _fact("fa3.fp8_error_vs_baseline"), "x", "H100 SXM", "lower numerical error of FP8 FlashAttention-3 (block "
        "quantization, incoherent processing) than a baseline FP8 attention", _source("fa3.fp8_error_vs_baseline")),
    "fa2.h100_utilization": lambda: Published(
        100 * _fact("fa2.h100_utilization"), "% of the dense FP16 peak", "H100 SXM", "FlashAttention-2's utilization, "
        "as the FlashAttention-3 paper measured it", _source("fa2.h100_utilization")),
    "fa2.a100_fraction_of_peak": lambda: Published(
        100 * _fact("fa2.a100_fraction_high"), "% of the theoretical peak", "A100", f"FlashAttention-2 forward and "
        f"backward (the paper: {100 * _fact('fa2.a100_fraction_low'):.0f}-{100 * _fact('fa2.a100_fraction_high'):.0f}%)",
        _source("fa2.a100_fraction_high")),
    "fa2.a100_training_tflops": lambda: Published(
        _fact("fa2.a100_training_tflops"), "TFLOP/s", "A100", "end-to-end GPT-style training with FlashAttention-2 "
        "(72% model FLOPs utilization)", _source("fa2.a100_training_tflops")),
    "pytorch.async_checkpoint_exposed": lambda: Published(
        100 * _fact("pytorch.async_checkpoint_async_s") / _fact("pytorch.async_checkpoint_blocking_s"),
        "% of the blocking save", "GPU training (IBM Research)", f"a 7B model's down time per checkpoint, DCP async_save "
        f"against a blocking save: {_fact('pytorch.async_checkpoint_blocking_s')} s -> "
        f"{_fact('pytorch.async_checkpoint_async_s')} s (what remains is the staging copy)",
        _source("pytorch.async_checkpoint_async_s")),
    "flashmla.decode_hbm_fraction": _flashmla_hbm_fraction,
    "deepseek.decode_requests_per_gpu": _decode_requests_per_gpu,
    "nccl.allreduce_busbw_8xh100": lambda: _comm("nccl_allreduce_busbw_8xH100"),
    "deepep.h800_internode_dispatch_ep64": lambda: _comm(
        "deepep_h800_internode_dispatch_ep64", "DeepEP V1 normal kernels, EP 64 over 8 nodes, one CX7 400 Gb/s NIC "
        "per GPU, FP8 dispatch (bottleneck bandwidth)"),
    "deepseek.fb_pair_comm_hidden": _fb_comm_hidden,
    "cuda.event_resolution": lambda: Published(
        _fact("cuda.event_resolution_us"), "us", "any CUDA GPU", "the resolution of a CUDA event pair's elapsed time",
        _source("cuda.event_resolution_us")),
}


def names() -> list[str]:
    return sorted(_FIGURES)


def figure(name: str) -> Published:
    """The published figure `name` (see `names()`), with its source."""
    if name not in _FIGURES:
        raise ValueError(f"{name!r} is not a published figure; known: {', '.join(names())}")
    return _FIGURES[name]()

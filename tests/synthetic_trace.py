"""A small synthetic trace in the format of DeepSeek's profile-data train.json (PyTorch-profiler Chrome trace): host
annotations per phase inside ProfilerStep#1, cuda_runtime launches with correlation ids, kernels on a compute stream
(7), a second compute stream (23) and DeepEP's stream (27). Times in microseconds, chosen so that every figure the
readers derive can be worked out by hand (see EXPECTED)."""
from __future__ import annotations

import json

HOST_PID, HOST_TID = 1166, 1166

# (phase, host start, host duration, [(kernel name, stream, gpu start, gpu duration), ...])
PHASES = [
    ("combine(B)", 10, 20, [("void dpsk::ep::internode::cached_notify<false>(int)", 27, 100, 50),
                            ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*)", 27, 150, 100)]),
    ("attn(F)", 30, 30, [("void layer_norm::ln_fwd_kernel<layer_norm::Kernel_traits<bf16>>", 7, 100, 20),
                         ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>(Params)", 7,
                          120, 60),
                         ("void flash::compute_attn_ws<Flash_fwd_kernel_traits<192, 128>>", 7, 180, 100)]),
    ("dispatch(F)", 60, 200, [("void dpsk::ep::internode::notify_dispatch<false, 8>(int const*)", 27, 280, 40),
                              ("void dpsk::ep::internode::dispatch<false, 8, false, 8>(int4*)", 27, 320, 80)]),
    ("mlp(B)", 260, 20, [("void cuda::per_token_cast_to_fp8_with_channels<__nv_bfloat16, 128>", 7, 290, 10),
                         ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::m_grouped_fp8_ptp128c::GemmKernel>",
                          7, 300, 150)]),
    ("mlp(W)", 280, 10, [("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_dptp128c_acc::GemmKernel>", 7,
                          450, 50),
                         ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_dptp128c_acc::GemmKernel>", 23,
                          460, 60)]),
    ("combine(F)", 290, 10, [("void dpsk::ep::internode::combine<false, 8, __nv_bfloat16>(int4*)", 27, 520, 100)]),
    ("attn(B)", 300, 20, [("void cutlass::device_kernel<flash::FlashAttnBwd<flash::CollectiveMainloopBwd<2>>>", 7, 520,
                           60), ("rotary_kernel", 7, 580, 20)]),
]
STEP = ("ProfilerStep#1", 0, 400)

# worked out by hand from PHASES: GPU span 100 -> 620 (no gap: idle 0); compute (7, 23) busy [100, 280) +
# [290, 600) = 490; comm (27) busy [100, 250) + [280, 400) + [520, 620) = 370; overlap [100, 250) + [290, 400) +
# [520, 600) = 340, so 30 exposed; GEMMs [120, 180) + [300, 450) + [450, 520) = 280
EXPECTED = {"gpu_ms": 0.52, "host_ms": 0.4, "compute_busy_ms": 0.49, "comm_busy_ms": 0.37, "overlap_ms": 0.34,
            "exposed_comm_ms": 0.03, "idle_ms": 0.0, "gemm_busy_ms": 0.28}


def events() -> list:
    ev = [{"ph": "X", "cat": "user_annotation", "name": STEP[0], "pid": HOST_PID, "tid": HOST_TID, "ts": STEP[1],
           "dur": STEP[2]},
          {"ph": "X", "cat": "user_annotation", "name": "1F1B", "pid": HOST_PID, "tid": HOST_TID, "ts": 1, "dur": 398},
          {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python3"}}]
    corr = 1000
    for name, ts, dur, kernels in PHASES:
        ev.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": HOST_PID, "tid": HOST_TID, "ts": ts,
                   "dur": dur})
        for i, (kname, stream, start, kdur) in enumerate(kernels):
            corr += 1
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": HOST_PID, "tid": HOST_TID,
                       "ts": ts + 1 + i, "dur": 1, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": stream, "ts": start, "dur": kdur,
                       "args": {"stream": stream, "correlation": corr, "grid": [112, 1, 1]}})
            ev.append({"ph": "f", "cat": "ac2g", "id": corr, "pid": 0, "tid": stream, "ts": start})
    # a kernel launched outside the step (must be ignored)
    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": HOST_PID, "tid": HOST_TID,
               "ts": 450, "dur": 1, "args": {"correlation": 5000}})
    ev.append({"ph": "X", "cat": "kernel", "name": "void at::native::elementwise_kernel<128, 4>", "pid": 0, "tid": 7,
               "ts": 700, "dur": 5, "args": {"stream": 7, "correlation": 5000}})
    return ev


def trace() -> dict:
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H800", "numSms": 132}],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 64},
            "traceName": "synthetic.json", "traceEvents": events()}


def write(path, data=None) -> str:
    path.write_text(json.dumps(trace() if data is None else data))
    return str(path)

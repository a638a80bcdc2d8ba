"""GPU launch configurations: the shared memory a configuration needs, what the device allows
(data/hardware.json), which configurations fit, autotuning over them, and ahead-of-time compilation for sm_90 without
a GPU (registers, spills: `aot_table`, committed in data/profiles/attention_sm90_aot.csv)."""
from __future__ import annotations

from common.core.validate import whole
from common.kernels.attention.triton_kernels import build_kernels

# Every configuration is compiled for sm_90 on a CPU by tests/test_attention.py and aot_table (table committed in
# data/profiles/attention_sm90_aot.csv): none spills registers at head_dim <= 128 (4-warp 128 x 64 tiles did: dropped).
GPU_CONFIGS = [  # (BLOCK_M, BLOCK_N, num_warps, num_stages): the forward
    (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3), (128, 32, 4, 4),
    (64, 64, 4, 3), (64, 32, 4, 4),
]
BWD_GPU_CONFIGS = {  # the backward's two kernels: dK/dV (a key block, a loop over query blocks) and dQ (the reverse)
    "dkdv": [(32, 128, 8, 3), (64, 128, 8, 2), (64, 64, 4, 3), (32, 64, 4, 3), (16, 64, 4, 2)],
    "dq": [(128, 32, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (64, 32, 4, 3), (64, 16, 4, 2)],
}


def smem_estimate_bytes(kind: str, block_m: int, block_n: int, head_dim: int, num_stages: int,
                        elem_bytes: int = 2) -> int:
    """Shared memory a kernel of this module needs at one configuration, in bytes (an estimate of Triton's layout).

    The tile that stays on chip is held once; the tiles that stream past are pipelined in `num_stages` buffers.
    "fwd": Q (block_m x d) + K and V (block_n x d each) per stage; "dkdv": K, V + Q and dO (block_m x d) per stage;
    "dq": Q, dO + K and V per stage. Checked against Triton's own count by the sm_90 compile test.
    """
    for name, value in (("block_m", block_m), ("block_n", block_n), ("head_dim", head_dim),
                        ("num_stages", num_stages), ("elem_bytes", elem_bytes)):
        whole(name, value)
    held, streamed = {"fwd": (block_m, 2 * block_n), "dkdv": (2 * block_n, 2 * block_m),
                      "dq": (2 * block_m, 2 * block_n)}.get(kind, (None, None))
    if held is None:
        raise ValueError(f"kind={kind!r}; allowed: 'fwd', 'dkdv', 'dq'")
    rows = num_stages * 2 * block_m * 4 if kind == "dkdv" else 0  # L and D (float32) stream with Q and dO
    return elem_bytes * head_dim * (held + num_stages * streamed) + rows


def smem_per_block_bytes(gpu_id: str | None = None) -> int:
    """The shared memory one thread block may use on `gpu_id` (default: this machine's GPU), from data/hardware.json
    (`smem_per_block_kib`, KiB). A GPU missing from data/ falls back to what the driver reports (opt-in maximum)."""
    from common.facts import hardware
    if gpu_id is None:
        import torch
        if not torch.cuda.is_available():
            raise ValueError("gpu_id=None needs a CUDA GPU here; give a GPU id from data/hardware.json "
                             f"({', '.join(hardware.gpu_ids())})")
        from common.core.env import identify_gpu
        gpu_id = identify_gpu(torch.cuda.get_device_name(0))
        if gpu_id is None or gpu_id not in hardware.gpu_ids():
            props = torch.cuda.get_device_properties(0)
            return int(getattr(props, "shared_memory_per_block_optin", 0) or props.shared_memory_per_block)
    gid = hardware._resolve(gpu_id, hardware.gpu_ids(), "GPU id", "gpu_id")
    kib = hardware._data()["gpus"][gid].get("smem_per_block_kib")
    if kib is None:
        raise ValueError(f"data/hardware.json has no smem_per_block_kib for {gid}")
    return int(kib * 1024)


def fitting_configs(kind: str, head_dim: int, smem_bytes: int, elem_bytes: int = 2) -> list[tuple]:
    """The launch configurations (BLOCK_M, BLOCK_N, num_warps, num_stages) of `kind` whose shared memory fits in
    `smem_bytes`; a ValueError naming the head dim and the memory when none does (nothing is launched that cannot
    run)."""
    configs = GPU_CONFIGS if kind == "fwd" else BWD_GPU_CONFIGS.get(kind)
    if configs is None:
        raise ValueError(f"kind={kind!r}; allowed: 'fwd', 'dkdv', 'dq'")
    fit = [c for c in configs if smem_estimate_bytes(kind, c[0], c[1], head_dim, c[3], elem_bytes) <= smem_bytes]
    if not fit:
        need = min(smem_estimate_bytes(kind, c[0], c[1], head_dim, c[3], elem_bytes) for c in configs)
        raise ValueError(f"head_dim={head_dim}: no {kind} configuration fits in {smem_bytes // 1024} KiB of shared "
                         f"memory per block (the smallest needs {need // 1024} KiB); use a smaller head_dim")
    return fit


_tuned: dict = {}


def _tuned_kernel(kind: str, head_dim: int, elem_bytes: int):
    """The `kind` kernel autotuned over the configurations that fit this GPU's shared memory (cached per shape)."""
    import triton
    smem = smem_per_block_bytes()
    key = (kind, head_dim, elem_bytes, smem)
    if key not in _tuned:
        fit = fitting_configs(kind, head_dim, smem, elem_bytes)
        configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in fit]
        _tuned[key] = triton.autotune(configs, key=["N_CTX", "HEAD_DIM", "CAUSAL"])(build_kernels()[
            "plain" if kind == "fwd" else kind])
    return _tuned[key]


def compile_for_gpu(arch: int = 90, head_dim: int = 128, causal: bool = False, block_m: int = 128,
                    block_n: int = 64, num_warps: int = 8, num_stages: int = 3, dtype: str = "bf16", kernel=None,
                    kind: str = "fwd"):
    """Compile a kernel of this module ahead of time for an NVIDIA GPU of compute capability `arch` (90: H100/H200),
    with no GPU present; return Triton's compiled kernel (`.asm["ptx"]`, `.metadata.shared` = shared memory bytes,
    `.n_regs` / `.n_spills` once `registers_and_spills` has run ptxas on it).

    kind: "fwd" (the forward, writing L too), "dkdv" or "dq" (the backward's kernels). Needs Triton's NVIDIA backend
    and TRITON_INTERPRET unset in this process (the interpreter replaces kernels).
    """
    if _interpreted():
        raise RuntimeError("compile_for_gpu needs TRITON_INTERPRET unset: run it in a process without the interpreter")
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype={dtype!r}; allowed: 'bf16', 'fp16', 'fp32'")
    if kind not in ("fwd", "dkdv", "dq"):
        raise ValueError(f"kind={kind!r}; allowed: 'fwd', 'dkdv', 'dq'")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    kernels = build_kernels()
    ptr, f32 = f"*{dtype}", "*fp32"
    constexprs = {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n, "CAUSAL": bool(causal)}
    tail = {"sm_scale": "fp32", "N_CTX": "i32", "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr",
            "BLOCK_N": "constexpr", "CAUSAL": "constexpr"}
    if kind == "fwd":
        kernel = kernel or kernels["plain"]
        signature = {"Q": ptr, "K": ptr, "V": ptr, "O": ptr, **tail, "L": f32, "STORE_LSE": "constexpr"}
        constexprs["STORE_LSE"] = True
        pointers = (0, 1, 2, 3, 10)
        n_ctx = 5
    else:
        kernel = kernel or kernels[kind]
        outs = {"DK": ptr, "DV": ptr} if kind == "dkdv" else {"DQ": ptr}
        signature = {"Q": ptr, "K": ptr, "V": ptr, "DO": ptr, "L": f32, "D": f32, **outs, **tail}
        pointers = tuple(range(6 + len(outs)))
        n_ctx = 7 + len(outs)
    # what a launch specialises on: 16-byte aligned pointers (torch allocations are), N_CTX a multiple of 16
    attrs = {(i,): [["tt.divisibility", 16]] for i in (*pointers, n_ctx)}
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def registers_and_spills(compiled, arch: int = 90) -> dict:
    """Registers per thread and spill bytes of a `compile_for_gpu` result, from Triton's bundled ptxas -v (no GPU)."""
    import os
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas
    tool = get_ptxas(arch)
    ptx = compiled.asm["ptx"]
    target = re.search(r"^\.target (\S+)", ptx, re.M).group(1)
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([getattr(tool, "path", tool), f"-arch={target}", "-v", src, "-o", os.path.join(d, "k.o")],
                           capture_output=True, text=True, timeout=300)
    text = r.stdout + r.stderr
    if r.returncode:
        raise RuntimeError(f"ptxas failed: {text[-1000:]}")
    regs = re.search(r"Used (\d+) registers", text)
    stores = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_stores": int(stores.group(1)) if stores else 0, "spill_loads": int(stores.group(2)) if stores else 0}


def aot_table(arch: int = 90, head_dims=(64, 128, 256), kinds=("fwd", "dkdv", "dq"), gpu_id: str = "H200-SXM",
              causal: bool = True, dtype: str = "bf16") -> list[dict]:
    """Compile every launch configuration ahead of time for `arch` and return one row per (kernel, head dim, config):
    shared memory (Triton's count and this module's estimate), registers per thread, spills, and whether it fits the
    per-block shared memory of `gpu_id` (data/hardware.json) -- what the GPU would refuse, found without one."""
    limit = smem_per_block_bytes(gpu_id)
    rows = []
    for kind in kinds:
        for d in head_dims:
            for bm, bn, w, st in (GPU_CONFIGS if kind == "fwd" else BWD_GPU_CONFIGS[kind]):
                c = compile_for_gpu(arch, head_dim=d, causal=causal, block_m=bm, block_n=bn, num_warps=w,
                                    num_stages=st, dtype=dtype, kind=kind)
                est = smem_estimate_bytes(kind, bm, bn, d, st, 2 if dtype != "fp32" else 4)
                rows.append({"kernel": kind, "head_dim": d, "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w,
                             "num_stages": st, "shared_bytes": c.metadata.shared, "estimate_bytes": est,
                             **registers_and_spills(c, arch), "limit_bytes": limit,
                             "fits": c.metadata.shared <= limit, "pruned": est > limit})
    return rows


def _interpreted() -> bool:
    import os
    return os.environ.get("TRITON_INTERPRET") == "1"


def _refuse_if_too_big(kind, block_m, block_n, head_dim, num_stages, elem_bytes):
    need = smem_estimate_bytes(kind, block_m, block_n, head_dim, num_stages, elem_bytes)
    have = smem_per_block_bytes()
    if need > have:
        raise ValueError(f"block_m={block_m}, block_n={block_n} at head_dim={head_dim} need about {need // 1024} KiB "
                         f"of shared memory per block ({num_stages} stages); this GPU allows {have // 1024} KiB")

"""The Triton FlashAttention forward: `launch_forward` runs any kernel of its signature (the lab's exercise) with a guard
zone behind O; `flash_attention` runs this package's kernel, autotuned on a GPU."""
from __future__ import annotations

import inspect

from common.kernels.attention.launch_configs import _interpreted, _refuse_if_too_big, _tuned_kernel
from common.kernels.attention.reference import _check_qkv, check_kernel_inputs
from common.kernels.attention.triton_kernels import build_kernels

# Launch shapes of the Triton kernel interpreted on a CPU: few, large blocks (the interpreter pays per operation).
# Compiled on a GPU it is autotuned (launch_configs.GPU_CONFIGS; BLOCK_M must be a multiple of BLOCK_N).
CPU_BLOCKS = (64, 64)
# (BLOCK_M, BLOCK_N) for every launch that names no blocks, on any device, when set (a checker's cases set it).
BLOCKS: tuple[int, int] | None = None


def _kernel_source(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)
    while hasattr(fn, "fn"):  # an autotuner wraps a JITFunction
        fn = fn.fn
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def launch_forward(kernel, q, k, v, causal: bool = False, block_m: int | None = None, block_n: int | None = None,
                   scale: float | None = None, guard: bool = True, **constexprs):
    """Run a FlashAttention forward `kernel` (the signature of `flash_fwd_kernel`) on (B, H, N, D) tensors.

    The launcher makes q, k, v contiguous, allocates O, and launches a grid (ceil(N / BLOCK_M), B * H). Block sizes:
    given, else `BLOCKS` when set, else CPU_BLOCKS under the interpreter and (128, 64) compiled. An autotuned kernel
    picks its own. O is allocated with a guard zone behind it (`guard=True`), and a kernel that writes past the end
    of O is reported. `sm_scale` passed to the kernel is 1/sqrt(d) (no log2(e) folded in) unless `scale` is given.
    """
    import torch
    b, h, n, d = check_kernel_inputs(q, k, v, "forward")
    if "NotImplementedError" in _kernel_source(kernel):
        raise NotImplementedError("the kernel body is still a stub")
    import triton
    scale = d ** -0.5 if scale is None else scale
    qc, kc, vc = (t.contiguous() for t in (q, k, v))
    if guard:
        buf = torch.full((b * h * n * d + 4096,), float("nan"), dtype=q.dtype, device=q.device)
    else:
        buf = torch.empty((b * h * n * d,), dtype=q.dtype, device=q.device)
    o = buf[: b * h * n * d].view(b, h, n, d)
    tuned = hasattr(kernel, "configs")  # a triton.autotune wrapper chooses BLOCK_M / BLOCK_N itself
    if tuned:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), b * h)  # noqa: E731
        kernel[grid](qc, kc, vc, o, scale, n, HEAD_DIM=d, CAUSAL=bool(causal), **constexprs)
    else:
        dm, dn = BLOCKS or (CPU_BLOCKS if (_interpreted() or q.device.type == "cpu") else (128, 64))
        block_m, block_n = block_m or dm, block_n or dn
        if q.device.type == "cuda":
            _refuse_if_too_big("fwd", block_m, block_n, d, constexprs.get("num_stages", 3), q.element_size())
        grid = (triton.cdiv(n, block_m), b * h)
        kernel[grid](qc, kc, vc, o, scale, n, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal),
                     **constexprs)
    if guard and not torch.isnan(buf[b * h * n * d:]).all():
        raise RuntimeError("the kernel wrote past the end of O: mask the stores of rows >= N_CTX")
    return o



def flash_attention(q, k, v, causal: bool = False, block_m: int | None = None, block_n: int | None = None,
                    scale: float | None = None, return_lse: bool = False):
    """The Triton FlashAttention forward of this module: autotuned on a GPU (over the configurations that fit its
    shared memory) unless block sizes are given. `return_lse=True` returns (O, L), L the logsumexp per row
    (B, H, N, float32) that the backward needs."""
    import torch
    _check_qkv(q, k, v)
    if block_m and block_n and block_m % block_n:  # the kernel's causal split needs whole key blocks per query block
        raise ValueError(f"block_m={block_m} must be a multiple of block_n={block_n}")
    kernel = build_kernels()["plain"]
    if q.is_cuda and not _interpreted() and not (block_m or block_n):
        kernel = _tuned_kernel("fwd", q.shape[-1], q.element_size())
    extra = {}
    if return_lse:
        b, h, n, _ = q.shape
        extra = {"L": torch.empty((b, h, n), dtype=torch.float32, device=q.device), "STORE_LSE": True}
    o = launch_forward(kernel, q, k, v, causal=causal, block_m=block_m, block_n=block_n, scale=scale, guard=False,
                       **extra)
    return (o, extra["L"]) if return_lse else o

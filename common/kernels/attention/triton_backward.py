"""The Triton FlashAttention backward (`flash_attention_backward`: D = rowsum(dO * O), then the dK/dV and dQ kernels)
and `flash_attn_func`, the differentiable pair; `sdpa`, PyTorch's fused attention, to compare with."""
from __future__ import annotations

from common.core.validate import whole
from common.kernels.attention.launch_configs import _interpreted, _refuse_if_too_big, _tuned_kernel
from common.kernels.attention.reference import check_kernel_inputs
from common.kernels.attention.triton_forward import flash_attention
from common.kernels.attention.triton_kernels import build_kernels


def flash_attention_backward(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None,
                             blocks: dict | None = None):
    """(dQ, dK, dV) from the Triton backward: D = rowsum(dO * O) in PyTorch, then two kernels.

    dK and dV: one program per key block, looping over the query blocks (causal: from the diagonal on); dQ: one
    program per query block, looping over the key blocks (causal: up to the diagonal). Splitting dQ off costs two
    recomputed matmuls (S and dP) per tile, but every output has one owner: no float32 atomic adds, a deterministic
    result, and autotuning may rerun a kernel freely. `blocks` = {"dkdv": (BLOCK_M, BLOCK_N), "dq": (...)}: fixed
    block sizes (default: autotuned on a GPU, 32 x 32 under the interpreter).
    """
    import torch
    import triton
    b, h, n, d = check_kernel_inputs(q, k, v, "backward")
    for name, t, shape in (("o", o, q.shape), ("do", do, q.shape), ("lse", lse, q.shape[:3])):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name} must be a tensor of shape {tuple(shape)}, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    scale = d ** -0.5 if scale is None else scale
    qc, kc, vc, oc, doc = (t.contiguous() for t in (q, k, v, o, do))
    lse = lse.float().contiguous()
    delta = (doc.float() * oc.float()).sum(-1)  # D = rowsum(dO * O), float32 (B, H, N)
    dq, dk, dv = torch.empty_like(qc), torch.empty_like(kc), torch.empty_like(vc)
    kernels = build_kernels()
    common_args = dict(HEAD_DIM=d, CAUSAL=bool(causal))
    for kind in ("dkdv", "dq"):
        outs = (dk, dv) if kind == "dkdv" else (dq,)
        fixed = (blocks or {}).get(kind)
        if q.is_cuda and not _interpreted() and fixed is None:
            kernel = _tuned_kernel(kind, d, q.element_size())
            along = "BLOCK_N" if kind == "dkdv" else "BLOCK_M"
            grid = lambda meta, along=along: (triton.cdiv(n, meta[along]), b * h)  # noqa: E731
            kernel[grid](qc, kc, vc, doc, lse, delta, *outs, scale, n, **common_args)
            continue
        bm, bn = fixed or (32, 32)
        whole("BLOCK_M", bm)
        whole("BLOCK_N", bn)
        if q.is_cuda:
            _refuse_if_too_big(kind, bm, bn, d, 3, q.element_size())
        grid = (triton.cdiv(n, bn if kind == "dkdv" else bm), b * h)
        kernels[kind][grid](qc, kc, vc, doc, lse, delta, *outs, scale, n, BLOCK_M=bm, BLOCK_N=bn, **common_args)
    return dq, dk, dv


_autograd: dict = {}


def flash_attn_func(q, k, v, causal: bool = False, scale: float | None = None):
    """Differentiable Triton attention: the forward kernel (saving O and L) and `flash_attention_backward`."""
    import torch
    if "fn" not in _autograd:
        class FlashAttentionFn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, causal, scale):
                o, lse = flash_attention(q, k, v, causal, scale=scale, return_lse=True)
                ctx.save_for_backward(q, k, v, o, lse)
                ctx.causal, ctx.scale = causal, scale
                return o

            @staticmethod
            def backward(ctx, do):
                q, k, v, o, lse = ctx.saved_tensors
                dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, ctx.causal, ctx.scale)
                return dq, dk, dv, None, None

        _autograd["fn"] = FlashAttentionFn
    return _autograd["fn"].apply(q, k, v, bool(causal), scale)


def sdpa(q, k, v, causal: bool = False):
    """PyTorch's fused attention (FlashAttention-2 / cuDNN / memory-efficient kernels on a GPU)."""
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

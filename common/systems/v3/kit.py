"""The published rates as lab 13's layer exercise (13.2) sees them: what a learner builds one MoE layer's forward and
backward compute time from, and the lab's own answer to hold it against.

`Kit(cfg, setup)` answers, for one GPU of the run described by a `kernels.Setup`:
- `gemm_tflops(m, n, k, kind, groups)`: DeepGEMM's tabled FP8 rate (all 132 SMs of an H800) for the forward, dgrad or
  wgrad GEMM of a linear layer Y[m, n] = X[m, k] W[n, k]^T (`kernel_rates.gemm_rate`: it maps dgrad and wgrad onto
  their tables, nearest row);
- `bf16_efficiency(m, n, k, kind)`: the fraction of the BF16 dense peak a BF16 GEMM of that layer reaches (no table
  was published: the lab's assumption, `kernel_rates.bf16_gemm_rate`); `peak_tflops(dtype, sparse)` the datasheet;
- `attention_tflops(direction)`: FlashAttention-3's causal rate at the sequence length (all SMs);
- `sm_share`, `hbm_tbs`, `ep`, `seq`, and `memory_bytes`: what the layer's memory-bound kernels read and write per
  direction (norms, casts, transposes, SwiGLU, RoPE, permutes: the recipe's bytes, `kernels.moe_layer`).
`layer_seconds(cfg, setup)` is the lab's model summed the same way: {"forward": attn(F) + mlp(F), "backward": mlp(B)
+ mlp(W) + attn(B) + attn(W)}, DeepEP's all-to-all left out.
"""
from __future__ import annotations

from common.facts import hardware
from common.systems.v3 import kernel_rates, kernels as v3kernels

FORWARD = ("attn(F)", "mlp(F)")
BACKWARD = ("mlp(B)", "mlp(W)", "attn(B)", "attn(W)")
_SHAPE = {"fwd": lambda m, n, k: (m, n, k), "dgrad": lambda m, n, k: (m, k, n), "wgrad": lambda m, n, k: (n, k, m)}


class Kit:
    """Rates and bytes for one GPU of the run `setup` describes (see the module's docstring)."""

    def __init__(self, cfg, setup: v3kernels.Setup | None = None):
        self.setup = s = setup or v3kernels.Setup()
        self.sm_share = s.sm_share
        self.hbm_tbs = kernel_rates.hbm_tbs(s.gpu_id) * s.hbm_efficiency
        self.ep, self.seq = s.ep, s.seq
        mem = [k for k in v3kernels.moe_layer(cfg, s) if k.flops == 0 and not k.cls.startswith("deepep")]
        self.memory_bytes = {"forward": sum(k.bytes for k in mem if k.phase in FORWARD),
                             "backward": sum(k.bytes for k in mem if k.phase in BACKWARD)}

    def gemm_tflops(self, m, n, k, kind: str = "fwd", groups: int = 1) -> float:
        s = self.setup
        return kernel_rates.gemm_rate(m, n, k, kind, groups, 1.0, s.gpu_id, s.kernels).tflops * s.gemm_scale

    def bf16_efficiency(self, m, n, k, kind: str = "fwd") -> float:
        if kind not in _SHAPE:
            raise ValueError(f"kind={kind!r} is not allowed; allowed: {', '.join(_SHAPE)}")
        s = self.setup
        rate = kernel_rates.bf16_gemm_rate(*_SHAPE[kind](m, n, k), 1.0, s.gpu_id, s.bf16_efficiency)
        return rate.tflops * s.gemm_scale / hardware.peak_tflops(s.gpu_id, "bf16")

    def peak_tflops(self, dtype: str = "bf16", sparse: bool = False) -> float:
        """The datasheet's dense peak (NVIDIA's headline figures with 2:4 sparsity are twice it: `sparse=True`)."""
        return hardware.peak_tflops(self.setup.gpu_id, dtype) * (2 if sparse else 1)

    def attention_tflops(self, direction: str) -> float:
        return kernel_rates.attention_rate(direction, self.seq, True, 1.0, self.setup.gpu_id).tflops


def layer_seconds(cfg, setup: v3kernels.Setup | None = None) -> dict:
    """The lab's model of one MoE layer's compute, by direction (seconds; DeepEP left out)."""
    ks = [k for k in v3kernels.moe_layer(cfg, setup or v3kernels.Setup()) if not k.cls.startswith("deepep")]
    return {"forward": sum(k.seconds for k in ks if k.phase in FORWARD),
            "backward": sum(k.seconds for k in ks if k.phase in BACKWARD)}

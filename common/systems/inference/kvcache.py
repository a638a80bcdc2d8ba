"""KV-cache sizing and paged allocation.

Bytes per token: standard attention caches K and V for every KV head in every layer,
`layers * kv_heads * (k_dim + v_dim) * bytes`; DeepSeek's MLA caches one compressed latent (kv_lora_rank values)
plus one shared RoPE key (qk_rope_head_dim values) per layer, `layers * (kv_lora_rank + rope_dim) * bytes`
(DeepSeek-V2 paper, arXiv 2405.04434, Sec. 2.1; 512 + 64 = 576 values for V3).

Paged allocation (vLLM's PagedAttention, arXiv 2309.06180) hands out fixed-size blocks of tokens as a sequence grows,
so a sequence wastes less than one block; contiguous allocation reserves the maximum length up front.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from common.core.validate import number


def _positive(**kw):
    for name, value in kw.items():
        number(name, value)


def kv_bytes_per_token(layers: int, kv_heads: int, k_dim: int, v_dim: int, bytes_per_value: float) -> float:
    """MHA/GQA/MQA: K and V of every KV head in every layer (GQA: kv_heads < query heads; MQA: kv_heads = 1)."""
    _positive(layers=layers, kv_heads=kv_heads, k_dim=k_dim, v_dim=v_dim, bytes_per_value=bytes_per_value)
    return layers * kv_heads * (k_dim + v_dim) * bytes_per_value


def mla_bytes_per_token(layers: int, kv_lora_rank: int, rope_dim: int, bytes_per_value: float) -> float:
    """MLA: one latent vector plus one decoupled RoPE key per layer, shared by all heads."""
    _positive(layers=layers, kv_lora_rank=kv_lora_rank, rope_dim=rope_dim, bytes_per_value=bytes_per_value)
    return layers * (kv_lora_rank + rope_dim) * bytes_per_value


def deepseek_v3_kv(cfg, bytes_per_value: float = 2) -> dict:
    """MLA bytes per token for a DeepSeek-style config, and two uncompressed equivalents: the same heads with full
    K (nope + rope dims) and V per head, and the DeepSeek-V2 paper's convention 2 * n_heads * d_head per layer."""
    layers, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    k_dim = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    return {
        "mla": mla_bytes_per_token(layers, cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], bytes_per_value),
        "mha_equivalent": kv_bytes_per_token(layers, heads, k_dim, cfg["v_head_dim"], bytes_per_value),
        "mha_paper_convention": kv_bytes_per_token(layers, heads, cfg["v_head_dim"], cfg["v_head_dim"],
                                                   bytes_per_value),
    }


def sequences_that_fit(memory_bytes: float, bytes_per_token: float, tokens_per_sequence: int) -> int:
    """How many sequences of a given length fit in `memory_bytes` of KV cache."""
    _positive(bytes_per_token=bytes_per_token, tokens_per_sequence=tokens_per_sequence)
    if memory_bytes < 0:
        raise ValueError(f"memory_bytes={memory_bytes} must be >= 0")
    return int(memory_bytes // (bytes_per_token * tokens_per_sequence))


@dataclass
class AllocationReport:
    policy: str
    sequences: int
    used_tokens: int
    reserved_tokens: int

    @property
    def waste_fraction(self) -> float:
        """Internal fragmentation: reserved slots holding no token, as a fraction of reserved."""
        return 1 - self.used_tokens / self.reserved_tokens if self.reserved_tokens else 0.0


def paged_waste(lengths, block_size: int) -> int:
    """Token slots reserved but unused when each sequence gets ceil(length / block_size) blocks."""
    _positive(block_size=block_size)
    return sum(math.ceil(n / block_size) * block_size - n for n in lengths)


def simulate_allocation(lengths, max_len: int, block_size: int, capacity_tokens: int) -> list[AllocationReport]:
    """Admit sequences in order until the cache is full, under contiguous (reserve max_len each) and paged
    (blocks of block_size as needed) policies; report how many fit and the wasted slots."""
    _positive(max_len=max_len, block_size=block_size, capacity_tokens=capacity_tokens)
    if any(n <= 0 or n > max_len for n in lengths):
        raise ValueError(f"every length must be in 1..max_len={max_len}")
    reports = []
    for policy in ("contiguous", "paged"):
        used = reserved = count = 0
        for n in lengths:
            need = max_len if policy == "contiguous" else math.ceil(n / block_size) * block_size
            if reserved + need > capacity_tokens:
                break
            used, reserved, count = used + n, reserved + need, count + 1
        reports.append(AllocationReport(policy, count, used, reserved))
    return reports

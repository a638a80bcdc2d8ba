"""Rows on the wire: a token's payload (fp32, bf16, or FP8 E4M3 with one float32 scale per 128 elements) and its
metadata (expert ids int32, gate weights float32), packed into one uint8 row per destination."""
from __future__ import annotations

import torch

from common.parallel.expert_parallel.config import SCALE_BLOCK, EPConfig

FP8_MAX = 448.0  # largest finite E4M3 value


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], -1)


def encode_fp8(x: torch.Tensor) -> torch.Tensor:
    """[n, H] float -> [n, H + 4*H/128] uint8: E4M3 elements, then one float32 scale per 128 elements."""
    n, h = x.shape
    blocks = x.float().reshape(n, h // SCALE_BLOCK, SCALE_BLOCK)
    amax = blocks.abs().amax(-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / scale.unsqueeze(-1)).reshape(n, h).to(torch.float8_e4m3fn)
    return torch.cat([as_bytes(q), as_bytes(scale)], dim=1)


def decode_fp8(b: torch.Tensor, hidden: int) -> torch.Tensor:
    n = b.shape[0]
    q = b[:, :hidden].contiguous().view(torch.float8_e4m3fn).float()
    scale = b[:, hidden:].contiguous().view(torch.float32)
    return (q.reshape(n, hidden // SCALE_BLOCK, SCALE_BLOCK) * scale.unsqueeze(-1)).reshape(n, hidden)


def dispatch_row_bytes(cfg: EPConfig) -> int:
    """Payload bytes of one dispatched token row."""
    return cfg.hidden + 4 * (cfg.hidden // SCALE_BLOCK) if cfg.fp8 else cfg.hidden * 4


def combine_row_bytes(cfg: EPConfig) -> int:
    return cfg.hidden * (2 if cfg.combine_bf16 else 4)


def encode_dispatch(x: torch.Tensor, cfg: EPConfig) -> torch.Tensor:
    return encode_fp8(x) if cfg.fp8 else as_bytes(x.float())


def decode_dispatch(b: torch.Tensor, cfg: EPConfig) -> torch.Tensor:
    if cfg.fp8:
        return decode_fp8(b, cfg.hidden)
    return b.contiguous().view(torch.float32).reshape(b.shape[0], cfg.hidden)


def encode_combine(y: torch.Tensor, cfg: EPConfig) -> torch.Tensor:
    return as_bytes(y.to(torch.bfloat16 if cfg.combine_bf16 else torch.float32))


def decode_combine(b: torch.Tensor, cfg: EPConfig) -> torch.Tensor:
    dtype = torch.bfloat16 if cfg.combine_bf16 else torch.float32
    return b.contiguous().view(dtype).reshape(b.shape[0], cfg.hidden).float()


def meta(indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return torch.cat([as_bytes(indices.to(torch.int32)), as_bytes(weights.float())], dim=1)


def unmeta(b: torch.Tensor, k: int):
    idx = b[:, :4 * k].contiguous().view(torch.int32).reshape(-1, k).long()
    w = b[:, 4 * k:8 * k].contiguous().view(torch.float32).reshape(-1, k)
    return idx, w

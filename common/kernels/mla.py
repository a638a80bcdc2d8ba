"""Multi-head latent attention (MLA; DeepSeek-V2, arXiv 2405.04434, sec. 2.1; V3 keeps it) three ways, each checked
against the one before, and what one decode step costs in each.

MLA caches, per token and layer, one latent `c` (kv_lora_rank values: 512 in V3) and one RoPE key `k_r` shared by
every head (qk_rope_head_dim: 64). Head h's key and value are up-projections of the latent:
k_h = [W_uk[h] c ; k_r] and v_h = W_uv[h] c; its query is [q_nope_h ; q_rope_h].

1. `decompressed`: up-project the cache into per-head K (qk_nope + qk_rope = 192 wide) and V (128), then ordinary
   attention -- what prefill does ("MHA mode").
2. `absorbed`: fold W_uk into the query (q_lat_h = W_uk[h]^T q_nope_h, a 512-vector) and W_uv after the attention, so
   scores and weighted sum run over the latent itself: q_h . k_h = q_lat_h . c + q_rope_h . k_r.
3. `mqa`: the same as one multi-query attention whose single key is [c ; k_r] (576 wide) and whose value is c (the
   key's first 512 values), shared by every head -- FlashMLA's interface ("MQA mode": head_dim_k 576, head_dim_v 512).

All three take the softmax scale as an argument; left out, it is the original head's 1 / sqrt(qk_nope + qk_rope)
(1/sqrt(192) for V3). DeepSeek-V3 serves contexts past its original 4,096 with YaRN and multiplies that scale by
mscale^2, mscale = 0.1 ln(40) + 1 (`yarn_mscale`; `MLADims.softmax_scale` = 1.874 / sqrt(192)). Queries are
the last Q of the T cached positions (causal: query i sits at position T - Q + i). Shapes: q_nope (Q, H, nope),
q_rope (Q, H, rope), latent (T, kv_lora), k_rope (T, rope), w_uk (H, nope, kv_lora), w_uv (H, kv_lora, v_dim).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from common.core.validate import number, whole


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention scaling (DeepSeek-V3 inference/model.py, MLA.__init__): 0.1 x mscale x ln(factor) + 1 for a
    context stretched `factor` times, 1 when factor <= 1. The softmax scale is multiplied by its square."""
    number("factor", factor)
    return 0.1 * number("mscale", mscale, strict=False) * math.log(factor) + 1.0 if factor > 1 else 1.0


def config_mscale(cfg, max_seq_len: int | None = None) -> float:
    """mscale of a model config served up to `max_seq_len` tokens (default: its inference code's max_seq_len, else
    max_position_embeddings): yarn_mscale(factor, mscale_all_dim) of its rope_scaling when max_seq_len exceeds the
    original context, as DeepSeek's model.py does; 1 without rope_scaling. DeepSeek-V3: 0.1 ln 40 + 1 = 1.369."""
    rs = cfg.get("rope_scaling")
    if not rs:
        return 1.0
    served = max_seq_len or getattr(cfg, "inference", {}).get("max_seq_len") or cfg.get("max_position_embeddings")
    if not served or whole("max_seq_len", served) <= rs["original_max_position_embeddings"]:
        return 1.0
    return yarn_mscale(rs["factor"], rs.get("mscale_all_dim", rs.get("mscale", 1.0)))


@dataclass(frozen=True)
class MLADims:
    """The attention dimensions MLA's decode depends on, and YaRN's mscale (1: no context extension)."""

    heads: int
    kv_lora: int
    nope: int
    rope: int
    v_dim: int
    mscale: float = 1.0

    def __post_init__(self):
        for name in ("heads", "kv_lora", "nope", "rope", "v_dim"):
            whole(name, getattr(self, name))
        number("mscale", self.mscale)

    @classmethod
    def from_config(cls, cfg, max_seq_len: int | None = None) -> "MLADims":
        """From a model config of data/models/ with MLA attention (DeepSeek-V3, Kimi K2); mscale as `config_mscale`."""
        if cfg["attention"] != "mla":
            raise ValueError(f"config attention={cfg['attention']!r}: MLADims needs an MLA model")
        return cls(cfg["num_attention_heads"], cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                   cfg["v_head_dim"], config_mscale(cfg, max_seq_len))

    @property
    def qk_dim(self) -> int:
        return self.nope + self.rope

    @property
    def latent_width(self) -> int:
        """Values cached per token and layer: latent + RoPE key (576 for V3)."""
        return self.kv_lora + self.rope

    @property
    def scale(self) -> float:
        """The original head's 1 / sqrt(qk_dim), without YaRN's mscale."""
        return 1.0 / math.sqrt(self.qk_dim)

    @property
    def softmax_scale(self) -> float:
        """The scale the model applies: 1 / sqrt(qk_dim) x mscale^2 (DeepSeek-V3 at max_seq_len 16,384: 1.874 /
        sqrt(192))."""
        return self.scale * self.mscale ** 2


def random_case(dims: MLADims, tokens: int, queries: int = 1, gen: torch.Generator | None = None,
                dtype=torch.float64) -> dict:
    """Fresh random queries, cache and up-projections at scales that keep scores O(1) (weights ~ 1/sqrt(fan-in))."""
    if not 1 <= queries <= tokens:
        raise ValueError(f"queries={queries}, tokens={tokens}: need 1 <= queries <= tokens (queries are the last "
                         f"positions of the cache)")
    g = gen if gen is not None else torch.Generator().manual_seed(0)
    d = dims

    def r(*shape, std=1.0):
        return torch.randn(*shape, generator=g, dtype=dtype) * std
    return {"q_nope": r(queries, d.heads, d.nope), "q_rope": r(queries, d.heads, d.rope),
            "latent": r(tokens, d.kv_lora), "k_rope": r(tokens, d.rope),
            "w_uk": r(d.heads, d.nope, d.kv_lora, std=d.kv_lora ** -0.5),
            "w_uv": r(d.heads, d.kv_lora, d.v_dim, std=d.kv_lora ** -0.5)}


def _check(q_nope, q_rope, latent, k_rope, w_uk, w_uv) -> tuple:
    if q_nope.dim() != 3 or q_rope.dim() != 3 or latent.dim() != 2 or k_rope.dim() != 2:
        raise ValueError(f"q_nope {tuple(q_nope.shape)} and q_rope {tuple(q_rope.shape)} must be (Q, H, d); latent "
                         f"{tuple(latent.shape)} and k_rope {tuple(k_rope.shape)} must be (T, d)")
    (Q, H, nope), T = q_nope.shape, latent.shape[0]
    if q_rope.shape[:2] != (Q, H) or k_rope.shape[0] != T or q_rope.shape[2] != k_rope.shape[1]:
        raise ValueError(f"q_rope {tuple(q_rope.shape)} / k_rope {tuple(k_rope.shape)} do not match q_nope "
                         f"{tuple(q_nope.shape)} / latent {tuple(latent.shape)}")
    if w_uk.shape != (H, nope, latent.shape[1]) or w_uv.dim() != 3 or w_uv.shape[:2] != (H, latent.shape[1]):
        raise ValueError(f"w_uk {tuple(w_uk.shape)} must be (H, nope, kv_lora) = {(H, nope, latent.shape[1])} and "
                         f"w_uv {tuple(w_uv.shape)} (H, kv_lora, v_dim)")
    if Q > T:
        raise ValueError(f"{Q} queries but only {T} cached tokens: queries are the last positions of the cache")
    return Q, H, T


def causal_keep(queries: int, tokens: int, device=None) -> torch.Tensor:
    """(Q, T) bool: query i (at position T - Q + i) may attend key j <= T - Q + i."""
    pos = torch.arange(tokens - queries, tokens, device=device)[:, None]
    return torch.arange(tokens, device=device)[None, :] <= pos


def _softmax(scores: torch.Tensor, causal: bool) -> torch.Tensor:
    """scores (H, Q, T) -> probabilities along T, causally masked."""
    if causal:
        keep = causal_keep(scores.shape[1], scores.shape[2], scores.device)
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1)


def decompressed(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale: float | None = None, causal: bool = True):
    """MLA with the cache up-projected to per-head K and V: (Q, H, v_dim)."""
    Q, H, T = _check(q_nope, q_rope, latent, k_rope, w_uk, w_uv)
    scale = scale if scale is not None else 1.0 / math.sqrt(q_nope.shape[2] + q_rope.shape[2])
    k_nope = torch.einsum("tc,hdc->thd", latent, w_uk)            # (T, H, nope)
    keys = torch.cat([k_nope, k_rope[:, None, :].expand(T, H, k_rope.shape[1])], dim=-1)
    values = torch.einsum("tc,hcv->thv", latent, w_uv)            # (T, H, v)
    q = torch.cat([q_nope, q_rope], dim=-1)
    p = _softmax(torch.einsum("qhd,thd->hqt", q, keys) * scale, causal)
    return torch.einsum("hqt,thv->qhv", p, values)


def absorb_query(q_nope, w_uk):
    """q_lat[q, h] = W_uk[h]^T q_nope[q, h]: (Q, H, kv_lora)."""
    return torch.einsum("qhd,hdc->qhc", q_nope, w_uk)


def absorbed(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale: float | None = None, causal: bool = True):
    """MLA with W_uk absorbed into the query and W_uv applied after the attention: (Q, H, v_dim)."""
    _check(q_nope, q_rope, latent, k_rope, w_uk, w_uv)
    scale = scale if scale is not None else 1.0 / math.sqrt(q_nope.shape[2] + q_rope.shape[2])
    q_lat = absorb_query(q_nope, w_uk)
    scores = torch.einsum("qhc,tc->hqt", q_lat, latent) + torch.einsum("qhr,tr->hqt", q_rope, k_rope)
    p = _softmax(scores * scale, causal)
    o_lat = torch.einsum("hqt,tc->qhc", p, latent)
    return torch.einsum("qhc,hcv->qhv", o_lat, w_uv)


def mqa_inputs(q_nope, q_rope, latent, k_rope, w_uk) -> tuple:
    """(q, kv) of the MQA form: q = [q_lat ; q_rope] (Q, H, kv_lora + rope), kv = [latent ; k_rope] (T, same)."""
    return torch.cat([absorb_query(q_nope, w_uk), q_rope], dim=-1), torch.cat([latent, k_rope], dim=-1)


def mqa_attention(q, kv, head_dim_v: int, scale: float, causal: bool = True) -> tuple:
    """Multi-query attention of one sequence: every head of q (Q, H, dk) attends the single key kv (T, dk); the value
    is kv[:, :head_dim_v]. Returns (out (Q, H, head_dim_v), lse (Q, H)), natural-log log-sum-exp of the scores."""
    if q.dim() != 3 or kv.dim() != 2 or q.shape[2] != kv.shape[1]:
        raise ValueError(f"q {tuple(q.shape)} must be (Q, H, dk) and kv {tuple(kv.shape)} (T, dk) with the same dk")
    if not 0 < head_dim_v <= kv.shape[1]:
        raise ValueError(f"head_dim_v={head_dim_v} is not allowed; allowed: 1..{kv.shape[1]} (the value is the "
                         f"first head_dim_v columns of kv)")
    scores = torch.einsum("qhd,td->hqt", q, kv) * scale
    if causal:
        keep = causal_keep(q.shape[0], kv.shape[0], q.device)
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                          # (H, Q)
    out = torch.einsum("hqt,tv->qhv", torch.exp(scores - lse[..., None]), kv[:, :head_dim_v])
    return out, lse.transpose(0, 1)


def mqa(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale: float | None = None, causal: bool = True):
    """MLA as MQA over the 576-wide latent (FlashMLA's form), then W_uv: (Q, H, v_dim)."""
    _check(q_nope, q_rope, latent, k_rope, w_uk, w_uv)
    scale = scale if scale is not None else 1.0 / math.sqrt(q_nope.shape[2] + q_rope.shape[2])
    q, kv = mqa_inputs(q_nope, q_rope, latent, k_rope, w_uk)
    o_lat, _ = mqa_attention(q, kv, latent.shape[1], scale, causal)
    return torch.einsum("qhc,hcv->qhv", o_lat, w_uv)


FORMS = {"decompressed": decompressed, "absorbed": absorbed, "mqa": mqa}


def three_ways(case: dict, scale: float | None = None) -> dict:
    """The three forms on one case, and each one's largest absolute difference from the one before."""
    args = [case[k] for k in ("q_nope", "q_rope", "latent", "k_rope", "w_uk", "w_uv")]
    out = {name: fn(*args, scale=scale) for name, fn in FORMS.items()}
    return {"outputs": out,
            "absorbed_vs_decompressed": float((out["absorbed"] - out["decompressed"]).abs().max()),
            "mqa_vs_absorbed": float((out["mqa"] - out["absorbed"]).abs().max())}


# ---------------------------------------------------------------- what a decode step costs

def decode_costs(dims: MLADims, context: int, batch: int = 1, kv_bytes: float = 2, weight_bytes: float = 2) -> dict:
    """FLOPs and HBM bytes of the attention of one decode step (one new token per sequence, `batch` sequences with
    `context` cached tokens each), one layer, for each way to run MLA:
    - "MHA cache": K (qk_dim) and V (v_dim) of every head cached -- what MLA avoids;
    - "latent, decompressed each step": the latent cache up-projected by W_uk / W_uv at every step, then MHA;
    - "latent, absorbed (2 passes)": scores over the latent, then a second pass for the weighted sum (reads it twice);
    - "MQA over the latent (fused)": one pass, the 512-wide value being the key's first columns (FlashMLA).
    The up-projection weights (W_uk, W_uv) are read once per step for the whole batch."""
    d = dims
    whole("context", context), whole("batch", batch)
    H, T, B, c = d.heads, context, batch, d.kv_lora
    w_up = H * c * (d.nope + d.v_dim) * weight_bytes               # W_uk and W_uv
    mha_core = 2 * H * T * (d.qk_dim + d.v_dim)                      # QK^T and PV per sequence
    lat_core = 2 * H * T * (d.latent_width + c)                      # over the 576-wide key and 512-wide value
    absorb = 2 * H * c * (d.nope + d.v_dim)                          # q absorption + W_uv on the output
    rows = {
        "MHA cache": (B * mha_core, B * T * H * (d.qk_dim + d.v_dim) * kv_bytes),
        "latent, decompressed each step": (B * (mha_core + 2 * T * c * H * (d.nope + d.v_dim)),
                                           B * T * d.latent_width * kv_bytes + w_up),
        "latent, absorbed (2 passes)": (B * (lat_core + absorb), B * T * (d.latent_width + c) * kv_bytes + w_up),
        "MQA over the latent (fused)": (B * (lat_core + absorb), B * T * d.latent_width * kv_bytes + w_up),
    }
    return {k: {"flops": f, "bytes": b, "intensity": f / b} for k, (f, b) in rows.items()}


def prefill_core_flops(dims: MLADims, seq: int) -> dict:
    """Causal attention-core FLOPs of a prefill of `seq` tokens, one layer: in MHA mode (decompressed; head dims
    qk_dim / v_dim) and in MQA mode (absorbed; 576 / 512): why prefill decompresses and decode absorbs."""
    whole("seq", seq)
    pairs = seq * (seq + 1) / 2
    d = dims
    return {"MHA mode": 2 * d.heads * pairs * (d.qk_dim + d.v_dim),
            "MQA mode": 2 * d.heads * pairs * (d.latent_width + d.kv_lora)}

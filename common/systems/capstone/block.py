"""The block itself: weights, the pieces of one pre-norm MoE layer, one training step.

RMSNorm -> MLA attention (q = (h W_qa) W_qb; a shared latent c = h W_dkv, K = c W_uk, V = c W_uv; no decoupled
RoPE key: positions do not change the profile) -> residual -> RMSNorm -> the DeepSeek-V3 gate -> the shared expert
plus `top_k` routed experts -> residual. The loss is <out, probe> for a fixed random probe, so every parameter gets
a gradient. Each part runs inside a `record_function` range named in `COMPONENTS`, so a profile can be read per
part; autograd charges each backward function to the range of the forward op it differentiates
(`common.core.traces.component_shares`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from common.moe import moe
from common.systems.capstone import experts as ex
from common.systems.capstone.config import BASELINE, BlockConfig, Version

COMPONENTS = ("norm", "mla_proj", "attention_core", "gate", "routed_experts", "shared_expert")
LAYERS = {"loop": ex.moe_loop_forward, "sorted": ex.moe_sorted_forward, "grouped": ex.moe_grouped_forward}


def make_params(cfg: BlockConfig, seed: int = 0, device: str = "cpu", dtype=None) -> dict:
    """The block's weights (leaf tensors with requires_grad), drawn from a fixed seed in float64 and cast;
    scaled so activations stay O(1). Routed experts are stacked [E, H, F] / [E, F, H]."""
    dtype = dtype or cfg.torch_dtype
    g = torch.Generator().manual_seed(seed)
    d, a, e, f = cfg.hidden, cfg.attn_width, cfg.experts, cfg.expert_ffn

    def w(*shape, fan_in, scale=1.0):
        t = torch.randn(*shape, generator=g, dtype=torch.float64) * (scale / math.sqrt(fan_in))
        return t.to(device=device, dtype=dtype).requires_grad_()

    def norm_weight():
        return (1 + 0.1 * torch.randn(d, generator=g, dtype=torch.float64)).to(device, dtype).requires_grad_()

    return {
        "norm1": norm_weight(),
        "w_qa": w(d, cfg.q_rank, fan_in=d), "w_qb": w(cfg.q_rank, a, fan_in=cfg.q_rank),
        "w_dkv": w(d, cfg.kv_rank, fan_in=d), "w_uk": w(cfg.kv_rank, a, fan_in=cfg.kv_rank),
        "w_uv": w(cfg.kv_rank, a, fan_in=cfg.kv_rank), "w_o": w(a, d, fan_in=a),
        "norm2": norm_weight(),
        "w_router": w(d, e, fan_in=d, scale=2.0),
        "w_gate": w(e, d, f, fan_in=d), "w_up": w(e, d, f, fan_in=d), "w_down": w(e, f, d, fan_in=f),
        "s_gate": w(d, f, fan_in=d), "s_up": w(d, f, fan_in=d), "s_down": w(f, d, fan_in=f),
    }


def balanced_bias(cfg: BlockConfig, router_input: torch.Tensor, w_router: torch.Tensor, steps: int = 100,
                  gamma: tuple[float, float] = (3e-2, 1e-5)) -> torch.Tensor:
    """The gate's bias (chooses experts, does not weight them; no gradient) from DeepSeek-V3's auxiliary-loss-free
    update run on these router inputs [T, H] (lab 06): each step, bias += gamma x sign(mean load - load), gamma
    decaying geometrically from gamma[0] to gamma[1]. Returns the bias whose busiest expert was least loaded: a
    trained V3 keeps its experts' loads close to even, and so does this block (the busiest ~1.1x the mean)."""
    with torch.no_grad():
        logits = router_input @ w_router
        bias = torch.zeros(cfg.experts, device=logits.device, dtype=logits.dtype)
        best, best_max = bias.clone(), float("inf")
        for i in range(steps):
            _, indices = moe.deepseek_v3_gate(logits, bias, cfg.top_k, cfg.n_group, cfg.topk_group, cfg.route_scale)
            load = torch.bincount(indices.reshape(-1), minlength=cfg.experts).to(bias.dtype)
            if float(load.max()) < best_max:
                best, best_max = bias.clone(), float(load.max())
            bias += gamma[0] * (gamma[1] / gamma[0]) ** (i / max(steps - 1, 1)) * torch.sign(load.mean() - load)
    return best


def make_input(cfg: BlockConfig, seed: int = 0, device: str = "cpu", dtype=None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 2)
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g, dtype=torch.float64)
    return x.to(device, dtype or cfg.torch_dtype)


# ---------------------------------------------------------------------------------------------- the pieces
def rmsnorm_eager(x, w, eps: float):
    """RMSNorm as Hugging Face's DeepseekV3RMSNorm writes it: a square, a mean, an rsqrt and two products."""
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rmsnorm_fused(x, w, eps: float):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def causal_mask(n: int, device="cpu", dtype=torch.float32) -> torch.Tensor:
    """Additive causal mask [n, n]: 0 on and below the diagonal, -inf above."""
    return torch.full((n, n), float("-inf"), device=device, dtype=dtype).triu(1)


def eager_attention(q, k, v):
    """Hugging Face's eager attention: scores q k^T / sqrt(d) materialised [B, heads, N, N], a causal mask built and
    added, softmax, then p v."""
    n = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores + causal_mask(n, q.device, q.dtype)
    return torch.softmax(scores, dim=-1) @ v


def sdpa_attention(q, k, v):
    """F.scaled_dot_product_attention with is_causal: fused (flash on CPU and GPU), no mask, no N x N in memory."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# ---------------------------------------------------------------------------------------------- the block
class Block:
    """Weights, the router's bias (balanced on this seed's input, `make_input(cfg, seed)`) and the host-side log."""

    def __init__(self, cfg: BlockConfig, seed: int = 0, device: str = "cpu", dtype=None):
        self.cfg, self.seed, self.device = cfg, seed, device
        self.dtype = dtype or cfg.torch_dtype
        self.params = make_params(cfg, seed, device, self.dtype)
        g = torch.Generator().manual_seed(seed + 3)
        shape = (cfg.batch, cfg.seq, cfg.hidden)
        self.probe = torch.randn(*shape, generator=g, dtype=torch.float64).to(device, self.dtype)
        self.log: list = []  # what the host-syncing versions log
        with torch.no_grad():
            _, h = self.attend(make_input(cfg, seed, device, self.dtype), BASELINE)
        self.bias = balanced_bias(cfg, h, self.params["w_router"])

    def attend(self, x: torch.Tensor, version: Version) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention half: (x + attention(norm(x)), the router's input norm(...) [T, H])."""
        cfg, p = self.cfg, self.params
        b, n, d = x.shape
        rf = torch.profiler.record_function
        norm = norm_for(version)
        with rf("norm"):
            h = norm(x, p["norm1"], cfg.eps)
        with rf("mla_proj"):
            q = ((h @ p["w_qa"]) @ p["w_qb"]).view(b, n, cfg.heads, cfg.head_dim).transpose(1, 2)
            c = h @ p["w_dkv"]  # the latent an MLA KV cache would hold
            k = (c @ p["w_uk"]).view(b, n, cfg.heads, cfg.head_dim).transpose(1, 2)
            v = (c @ p["w_uv"]).view(b, n, cfg.heads, cfg.head_dim).transpose(1, 2)
        with rf("attention_core"):
            attend = eager_attention if version.attention == "eager" else sdpa_attention
            o = attend(q, k, v).transpose(1, 2).reshape(b, n, -1)
        with rf("mla_proj"):
            x = x + o @ p["w_o"]
        with rf("norm"):
            h = norm(x, p["norm2"], cfg.eps).reshape(b * n, d)
        return x, h

    def forward(self, x: torch.Tensor, version: Version = BASELINE, layers=None) -> torch.Tensor:
        """The block on x [B, N, H]. `layers` ({"sorted": fn, "grouped": fn}) replaces the workbook's routed-expert
        layer of that kind (a learner's; same signature as `experts.moe_grouped_forward`)."""
        cfg, p = self.cfg, self.params
        rf = torch.profiler.record_function
        x, h = self.attend(x, version)
        with rf("gate"):
            weights, indices = moe.deepseek_v3_gate(h @ p["w_router"], self.bias, cfg.top_k, cfg.n_group,
                                                    cfg.topk_group, cfg.route_scale)
        if version.log_loss:
            self.log.append(torch.bincount(indices.reshape(-1), minlength=cfg.experts).tolist())
        with rf("routed_experts"):
            layer = (layers or {}).get(version.moe) or LAYERS[version.moe]
            y = layer(h, weights, indices, p["w_gate"], p["w_up"], p["w_down"], ex.swiglu)
        with rf("shared_expert"):
            y = y + ex.ffn(h, p["s_gate"], p["s_up"], p["s_down"])
        return x + y.view(x.shape)

    def routing(self, x: torch.Tensor) -> torch.Tensor:
        """The experts chosen for x's tokens, indices [T, k] (no gradient)."""
        with torch.no_grad():
            _, h = self.attend(x, BASELINE)
            return moe.deepseek_v3_gate(h @ self.params["w_router"], self.bias, self.cfg.top_k, self.cfg.n_group,
                                        self.cfg.topk_group, self.cfg.route_scale)[1]

    def zero_grad(self) -> None:
        for t in self.params.values():
            t.grad = None


def norm_for(version: Version):
    """The RMSNorm a version uses."""
    return rmsnorm_eager if version.norm == "eager" else rmsnorm_fused


def step(block: Block, x: torch.Tensor, version: Version = BASELINE, layers=None) -> torch.Tensor:
    """One training step's compute: forward, loss = <out, probe>, backward (gradients land in block.params)."""
    block.zero_grad()
    out = block.forward(x, version, layers)
    loss = (out * block.probe).sum()
    if version.log_loss:
        loss_value = loss.item()  # logging the loss every step: a host sync
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"loss is {loss_value}")
        block.log.append(loss_value)
        del block.log[:-8]
    loss.backward()
    return out.detach()

"""Serving a small MLA model on the CPU, for real: prefill and decode over a paged latent cache, continuous batching.

`TinyMLA` has random, seeded weights (no download) and DeepSeek-V3's attention at a small size: per layer RMSNorm ->
MLA -> RMSNorm -> SwiGLU. Prefill runs MLA decompressed (MHA mode: the prompt's latents up-projected to per-head K
and V, causal SDPA); decode runs it absorbed, as MQA over the cached [latent ; RoPE key]
(`common.kernels.mla_decode.paged_attention`, what the Triton kernel computes on a GPU), one new token per sequence.
`serve(model, requests, max_batch)` runs requests with continuous batching (a finished request's place is refilled at
the next step) or static batching (a new batch only when the whole batch is done), greedy decoding, and times
prefill and decode apart; `decode_step_seconds(model, batch, context)` times one decode step at a fixed batch, and
`batch_speedup` the tokens/s a batch gains over batch 1, as a median over interleaved repeats with its spread.
"""
from __future__ import annotations

import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from common.core import timing
from common.core.validate import whole
from common.kernels import mla, mla_decode
from common.systems.inference.paged_kv import PagedKVCache

POLICIES = ("continuous", "static")


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 512
    hidden: int = 256
    layers: int = 4
    heads: int = 8
    kv_lora: int = 64
    nope: int = 32
    rope: int = 16
    v_dim: int = 32
    ffn: int = 512
    max_positions: int = 4096

    @property
    def dims(self) -> mla.MLADims:
        return mla.MLADims(self.heads, self.kv_lora, self.nope, self.rope, self.v_dim)


def _rms(x, w, eps: float = 1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class TinyMLA:
    """The model: weights drawn from a seeded generator, ~1/sqrt(fan-in) so activations stay O(1)."""

    def __init__(self, cfg: TinyConfig = TinyConfig(), seed: int = 0, dtype=torch.float32):
        self.cfg, self.dtype = cfg, dtype
        g = torch.Generator().manual_seed(seed)
        c = cfg

        def w(*shape, fan):
            return (torch.randn(*shape, generator=g) / math.sqrt(fan)).to(dtype)
        self.embed = w(c.vocab, c.hidden, fan=1)
        self.blocks = [{"wq": w(c.hidden, c.heads * (c.nope + c.rope), fan=c.hidden),
                        "wkv_a": w(c.hidden, c.kv_lora + c.rope, fan=c.hidden),
                        "kv_norm": torch.ones(c.kv_lora, dtype=dtype),
                        "w_uk": w(c.heads, c.nope, c.kv_lora, fan=c.kv_lora),
                        "w_uv": w(c.heads, c.kv_lora, c.v_dim, fan=c.kv_lora),
                        "wo": w(c.heads * c.v_dim, c.hidden, fan=c.heads * c.v_dim),
                        "norm1": torch.ones(c.hidden, dtype=dtype), "norm2": torch.ones(c.hidden, dtype=dtype),
                        "w_gate": w(c.hidden, c.ffn, fan=c.hidden), "w_up": w(c.hidden, c.ffn, fan=c.hidden),
                        "w_down": w(c.ffn, c.hidden, fan=c.ffn)} for _ in range(c.layers)]
        self.final_norm = torch.ones(c.hidden, dtype=dtype)
        self.lm_head = w(c.hidden, c.vocab, fan=c.hidden)
        inv = 1.0 / (10000 ** (torch.arange(0, c.rope, 2, dtype=torch.float64) / c.rope))
        ang = torch.arange(c.max_positions, dtype=torch.float64)[:, None] * inv[None, :]
        self._cos, self._sin = ang.cos().to(dtype), ang.sin().to(dtype)
        self.scale = c.dims.scale

    def new_cache(self, num_blocks: int, block_size: int = 16) -> PagedKVCache:
        return PagedKVCache(num_blocks, block_size, self.cfg.kv_lora + self.cfg.rope, self.cfg.layers, self.dtype)

    def _rope(self, x, pos):
        """Rotary embedding of the last dimension (pairs interleaved as halves) at positions `pos`."""
        cos, sin = self._cos[pos], self._sin[pos]
        while cos.dim() < x.dim():
            cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    def _attention_inputs(self, blk, x, pos):
        c = self.cfg
        h = _rms(x, blk["norm1"])
        q = (h @ blk["wq"]).view(-1, c.heads, c.nope + c.rope)
        kv = h @ blk["wkv_a"]
        latent = _rms(kv[:, :c.kv_lora], blk["kv_norm"])
        return q[..., :c.nope], self._rope(q[..., c.nope:], pos), latent, self._rope(kv[:, c.kv_lora:], pos)

    def _ffn(self, blk, x):
        h = _rms(x, blk["norm2"])
        return x + (F.silu(h @ blk["w_gate"]) * (h @ blk["w_up"])) @ blk["w_down"]

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor) -> tuple:
        """The prompt through the model, MLA decompressed (causal). Returns (logits of the last position (vocab,),
        the cache rows [latent ; k_rope] of every layer (layers, T, kv_lora + rope))."""
        c = self.cfg
        T = tokens.shape[0]
        if not 1 <= T <= c.max_positions:
            raise ValueError(f"a prompt of {T} tokens is not allowed; allowed: 1..{c.max_positions}")
        pos = torch.arange(T)
        x = self.embed[tokens]
        rows = []
        for blk in self.blocks:
            q_nope, q_rope, latent, k_rope = self._attention_inputs(blk, x, pos)
            rows.append(torch.cat([latent, k_rope], dim=-1))
            k = torch.cat([torch.einsum("tc,hdc->htd", latent, blk["w_uk"]),
                           k_rope[None].expand(c.heads, T, c.rope)], dim=-1)
            v = torch.einsum("tc,hcv->htv", latent, blk["w_uv"])
            q = torch.cat([q_nope, q_rope], dim=-1).transpose(0, 1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
            x = self._ffn(blk, x + o.transpose(0, 1).reshape(T, -1) @ blk["wo"])
        return _rms(x[-1], self.final_norm) @ self.lm_head, torch.stack(rows)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, cache: PagedKVCache, seq_ids: list) -> torch.Tensor:
        """One new token per sequence (tokens (B,)), MLA absorbed over the paged cache, which grows by one token
        per sequence. Returns logits (B, vocab)."""
        c = self.cfg
        pos = cache.seq_lens(seq_ids).long()
        slots = torch.cat([cache.extend(s, 1) for s in seq_ids])
        table, lens = cache.block_table(seq_ids), cache.seq_lens(seq_ids)
        x = self.embed[tokens]
        for layer, blk in enumerate(self.blocks):
            q_nope, q_rope, latent, k_rope = self._attention_inputs(blk, x, pos)
            cache.write(layer, slots, torch.cat([latent, k_rope], dim=-1))
            q = torch.cat([mla.absorb_query(q_nope, blk["w_uk"]), q_rope], dim=-1)[:, None]   # (B, 1, H, 80)
            o_lat = mla_decode.paged_attention(q, cache.storage[layer], table, lens, c.kv_lora, self.scale)
            o = torch.einsum("bhc,hcv->bhv", o_lat[:, 0], blk["w_uv"]).reshape(len(seq_ids), -1)
            x = self._ffn(blk, x + o @ blk["wo"])
        return _rms(x, self.final_norm) @ self.lm_head


# ---------------------------------------------------------------- serving

@dataclass(frozen=True)
class Request:
    rid: int
    prompt: torch.Tensor     # token ids (T,)
    max_new: int             # tokens to generate (greedy, no stop token)


def random_requests(n: int, vocab: int, prompt_range=(16, 96), new_range=(8, 32), seed: int = 0) -> list:
    """`n` requests with prompt lengths and output lengths drawn uniformly from the ranges (inclusive)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = int(torch.randint(prompt_range[0], prompt_range[1] + 1, (1,), generator=g))
        m = int(torch.randint(new_range[0], new_range[1] + 1, (1,), generator=g))
        out.append(Request(i, torch.randint(0, vocab, (p,), generator=g), m))
    return out


@dataclass
class Done:
    rid: int
    prompt_len: int
    tokens: list
    first_token_s: float     # since the run started (all requests arrive at 0)
    finished_s: float

    @property
    def seconds_per_output_token(self) -> float:
        """Time between tokens after the first (TPOT)."""
        n = len(self.tokens) - 1
        return (self.finished_s - self.first_token_s) / n if n else float("nan")


@dataclass
class ServeResult:
    policy: str
    max_batch: int
    done: list = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    steps: int = 0
    wall_s: float = 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s else float("nan")

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s else float("nan")

    @property
    def output_tokens_per_s(self) -> float:
        """Every generated token over the whole run (prefill included): the service's throughput."""
        return sum(len(d.tokens) for d in self.done) / self.wall_s

    @property
    def per_user_tokens_per_s(self) -> float:
        """1 / the mean time between a request's tokens: the speed one user sees."""
        tpot = [d.seconds_per_output_token for d in self.done if len(d.tokens) > 1]
        return len(tpot) / sum(tpot)

    @property
    def mean_latency_s(self) -> float:
        return sum(d.finished_s for d in self.done) / len(self.done)

    @property
    def mean_batch(self) -> float:
        return self.decode_tokens / self.steps if self.steps else 0.0

    def tokens(self) -> dict:
        return {d.rid: d.tokens for d in self.done}


def serve(model: TinyMLA, requests: list, max_batch: int, policy: str = "continuous", block_size: int = 16,
          num_blocks: int | None = None) -> ServeResult:
    """Run every request to its end; all arrive at time 0. The pool (default: enough for max_batch of the longest
    requests) admits a request only when its whole sequence fits, so nothing is preempted."""
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is not allowed; allowed: {', '.join(POLICIES)}")
    whole("max_batch", max_batch)
    longest = max(r.prompt.shape[0] + r.max_new for r in requests)
    blocks_each = -(-longest // block_size)
    cache = model.new_cache(num_blocks or max_batch * blocks_each, block_size)
    if cache.num_blocks < blocks_each:
        raise ValueError(f"num_blocks={num_blocks} cannot hold the longest request ({longest} tokens)")
    res = ServeResult(policy, max_batch)
    waiting, running = deque(requests), {}
    t0 = time.perf_counter()
    while waiting or running:
        if policy == "continuous" or not running:
            while waiting and len(running) < max_batch and \
                    cache.alloc.num_free >= -(-(waiting[0].prompt.shape[0] + waiting[0].max_new) // block_size):
                r = waiting.popleft()
                tp = time.perf_counter()
                logits, rows = model.prefill(r.prompt)
                cache.add(r.rid)
                cache.append(r.rid, rows)
                now = time.perf_counter()
                res.prefill_s += now - tp
                res.prefill_tokens += r.prompt.shape[0]
                running[r.rid] = [r, [int(logits.argmax())], now - t0]
                if r.max_new == 1:
                    _retire(running, r.rid, cache, res, now - t0)
        if running:
            ids = list(running)
            last = torch.tensor([running[i][1][-1] for i in ids])
            td = time.perf_counter()
            logits = model.decode(last, cache, ids)
            now = time.perf_counter()
            res.decode_s += now - td
            res.decode_tokens += len(ids)
            res.steps += 1
            for i, tok in zip(ids, logits.argmax(-1).tolist()):
                running[i][1].append(tok)
                if len(running[i][1]) >= running[i][0].max_new:
                    _retire(running, i, cache, res, now - t0)
    res.wall_s = time.perf_counter() - t0
    return res


def _retire(running: dict, rid, cache: PagedKVCache, res: ServeResult, t: float) -> None:
    r, toks, first = running.pop(rid)
    cache.free(rid)
    res.done.append(Done(rid, r.prompt.shape[0], toks, first, t))


def decode_step(model: TinyMLA, batch: int, context: int, block_size: int = 16, seed: int = 0):
    """A function that runs one decode step of `batch` sequences of `context` cached tokens (random cache rows: a
    step's cost depends on the shapes, not on the values) and undoes it, so it can be timed again and again."""
    whole("batch", batch), whole("context", context)
    g = torch.Generator().manual_seed(seed)
    cache = model.new_cache(batch * (-(-(context + 1) // block_size)), block_size)
    width = model.cfg.kv_lora + model.cfg.rope
    for s in range(batch):
        cache.add(s)
        cache.append(s, torch.randn(model.cfg.layers, context, width, generator=g, dtype=model.dtype))
    ids = list(range(batch))
    tokens = torch.randint(0, model.cfg.vocab, (batch,), generator=g)

    def step():
        model.decode(tokens, cache, ids)
        for s in ids:
            cache.truncate(s, context)
    return step


def decode_step_seconds(model: TinyMLA, batch: int, context: int, block_size: int = 16, min_run_time: float = 0.2,
                        seed: int = 0) -> timing.Timing:
    """The time of one decode step at a fixed batch (`decode_step`), timed with common.core.timing.bench."""
    return timing.bench(decode_step(model, batch, context, block_size, seed), label=f"decode step, batch {batch}",
                        device="cpu", min_run_time=min_run_time)


def batch_speedup(model: TinyMLA, batch: int = 32, context: int = 128, blocks: int = 5, per_block: int = 7,
                  seed: int = 0) -> dict:
    """Decode tokens/s at `batch` over batch 1, as a median over `blocks` repeats with its spread: each repeat
    times a step at batch 1 and at `batch` round-robin, `per_block` times each (`measurement.interleaved_samples`:
    the machine's load hits both alike), and takes the ratio of their median tokens/s. Returns speedup (the median
    ratio), low and high (the smallest and largest ratio), the ratios, and each batch's median step seconds."""
    from common.core import measurement
    whole("blocks", blocks), whole("per_block", per_block), whole("batch", batch, minimum=2)
    steps = {1: decode_step(model, 1, context, seed=seed), batch: decode_step(model, batch, context, seed=seed)}
    ratios, one, many = [], [], []
    for _ in range(blocks):
        t = measurement.interleaved_samples(steps, per_block)
        t1, tb = statistics.median(t[1]), statistics.median(t[batch])
        ratios.append(batch * t1 / tb)
        one.append(t1)
        many.append(tb)
    return {"batch": batch, "speedup": statistics.median(ratios), "low": min(ratios), "high": max(ratios),
            "ratios": ratios, "step_s_batch_1": statistics.median(one), "step_s_batch": statistics.median(many)}

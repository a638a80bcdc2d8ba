"""Lab 14's named wrong answers (issue 46): mistakes, look-alikes and cheats a learner would write, and the words
each verdict must use. The builds' wrong policies (14.6, 14.7, 14.8) and the warm-ups' mistakes are the checkers'
own named lists, fed as a learner's code; the rest are written here."""
import functools
import math
import re

import torch
import torch.nn.functional as F

from common.core import ceilings
from common.exercises import lab14
from common.exercises import lab14_cases as lc
from common.exercises.lab14_cases import warmup_cases as wc
from common.exercises.lab14_cases.decode_cases import DecodeAnswer
from common.kernels import mla, mla_decode
from common.systems.inference import kvcache, paged_kv, prefix_cache, scheduler
from test_exercises_lab14 import (_as_mask, _gathered, _prefix_as_learner, _scheduler_as_learner, _swapped, allocate,
                                  block_names, hit_tokens, new_token_mask, paged_mla_decode, release, schedule_step)

LIBRARY = r"the workbook's own code"
REFERENCE = r"the reference this exercise asks you to write"
CHECKER = r"the checker's own code"


# ---------------------------------------------------------------- 14.1
def kv(cfg, b, layers=None, heads=None, width=None, factor=1.0, per_value=None):
    L = cfg["num_hidden_layers"] if layers is None else layers(cfg)
    b = b if per_value is None else per_value
    if cfg["attention"] == "mla":
        w = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] if width is None else width(cfg)
        return L * w * b * factor * (heads(cfg) if heads else 1)
    h = cfg["num_key_value_heads"] if heads is None else heads(cfg)
    return L * h * 2 * cfg["head_dim"] * b * factor


def _gqa_alone(cfg, b):
    return kv(cfg, b) if cfg["attention"] == "mla" else kv(cfg, b, factor=0.5)


KV = [
    (lambda c, b: kv(c, b, width=lambda c: c["kv_lora_rank"]), "leaves out the decoupled RoPE key"),
    (lambda c, b: kv(c, b, width=lambda c: 2 * c["kv_lora_rank"] + c["qk_rope_head_dim"]), "caches the latent twice"),
    (lambda c, b: kv(c, b, width=lambda c: c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"],
                     heads=lambda c: c["num_attention_heads"]), "MHA-equivalent cache"),
    (lambda c, b: kv(c, b, heads=lambda c: c["num_attention_heads"]) if c["attention"] == "mla" else kv(c, b),
     "caches a latent per query head"),
    (lambda c, b: kv(c, b, heads=lambda c: c["num_attention_heads"]) if c["attention"] != "mla" else kv(c, b),
     "caches K and V for all the query heads"),
    (lambda c, b: kv(c, b, heads=lambda c: c["num_attention_heads"] // c["num_key_value_heads"])
     if c["attention"] != "mla" else kv(c, b), "uses the group size"),
    (_gqa_alone, "counts K or V alone"),
    (lambda c, b: kv(c, b, layers=lambda c: 1), "is one layer's cache"),
    (lambda c, b: kv(c, b, layers=lambda c: c["num_hidden_layers"] - (c["first_k_dense_replace"] or 0)),
     "counts only the MoE layers"),
    (lambda c, b: kv(c, b, per_value=1), "counts values, not bytes"),
    (lambda c, b: kv(c, b, per_value=2), "uses 2 bytes per value whatever"),
    (lambda c, b: kv(c, b) * 8, "is in bits"),
    (lambda c, b: kvcache.mla_bytes_per_token(c["num_hidden_layers"], c["kv_lora_rank"], c["qk_rope_head_dim"], b)
     if c["attention"] == "mla" else kv(c, b), REFERENCE),
    (lambda c, b: kvcache.deepseek_v3_kv(c, b)["mla"] if c["attention"] == "mla" else kv(c, b),
     LIBRARY),
]


# ---------------------------------------------------------------- 14.2
def absorbed(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale, rope=True, mask="right", over=-1, rope_scale=True,
             uv=True):
    q_lat = torch.einsum("qhd,hdc->hqc", q_nope, w_uk)
    s = q_lat @ latent.T * scale
    if rope:
        s = s + torch.einsum("qhr,tr->hqt", q_rope, k_rope) * (scale if rope_scale else 1.0)
    Q, T = q_nope.shape[0], latent.shape[0]
    i, t = torch.arange(Q)[:, None], torch.arange(T)[None, :]
    keep = {"right": t <= T - Q + i, "none": t >= 0, "strict": t < T - Q + i}[mask]
    p = torch.softmax(s.masked_fill(~keep, -math.inf), dim=over)
    o = p @ latent                                                      # (H, Q, kv_lora)
    return torch.einsum("hqc,hcv->qhv", o, w_uv) if uv else o.transpose(0, 1)


def _sdpa_top_left(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale):
    q = torch.cat([torch.einsum("qhd,hdc->hqc", q_nope, w_uk), q_rope.transpose(0, 1)], -1)
    kv_ = torch.cat([latent, k_rope], -1).expand(q.shape[0], -1, -1)
    o = F.scaled_dot_product_attention(q, kv_, kv_[..., :latent.shape[1]], is_causal=True, scale=scale)
    return torch.einsum("hqc,hcv->qhv", o, w_uv)


def _decompressed_by_hand(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale):
    keys = torch.einsum("tc,hdc->htd", latent, w_uk)                   # per-head keys: the form the exercise forbids
    values = torch.einsum("tc,hcv->htv", latent, w_uv)
    s = (torch.einsum("qhd,htd->hqt", q_nope, keys) + torch.einsum("qhr,tr->hqt", q_rope, k_rope)) * scale
    Q, T = q_nope.shape[0], latent.shape[0]
    s = s.masked_fill(torch.arange(T)[None, :] > torch.arange(T - Q, T)[:, None], -math.inf)
    return torch.einsum("hqt,htv->qhv", torch.softmax(s, -1), values)


def _values_per_head(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale):
    s = (torch.einsum("qhd,hdc,tc->hqt", q_nope, w_uk, latent) + torch.einsum("qhr,tr->hqt", q_rope, k_rope)) * scale
    Q, T = q_nope.shape[0], latent.shape[0]
    s = s.masked_fill(torch.arange(T)[None, :] > torch.arange(T - Q, T)[:, None], -math.inf)
    values = torch.stack([latent @ w_uv[h] for h in range(w_uv.shape[0])])   # (H, T, v): W_uv before the attention
    return torch.einsum("hqt,htv->qhv", torch.softmax(s, -1), values)


def _mqa_helpers(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale):
    q, kv_ = mla.mqa_inputs(q_nope, q_rope, latent, k_rope, w_uk)
    o, _ = mla.mqa_attention(q, kv_, latent.shape[1], scale)
    return torch.einsum("qhc,hcv->qhv", o, w_uv)


def _scales_in_place(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale):
    q_nope.mul_(1.0)
    out = absorbed(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale)
    latent.mul_(2.0)
    return out


ABSORBED = [
    (functools.partial(absorbed, rope=False), "RoPE scores q_rope . k_rope are missing"),
    (lambda *a: absorbed(*a[:6], (a[2].shape[1] + a[3].shape[1]) ** -0.5), re.escape("1/sqrt(kv_lora + rope)")),
    (lambda *a: absorbed(*a[:6], a[2].shape[1] ** -0.5), re.escape("scales by 1/sqrt(kv_lora);")),
    (lambda *a: absorbed(*a[:6], 1.0), "leaves out the softmax scale"),
    (lambda *a: absorbed(*a, rope_scale=False), "scales only the latent part"),
    (lambda *a: absorbed(*a, over=1), "normalises the softmax over the queries"),
    (lambda *a: absorbed(*a, mask="none"), "is not causal"),
    (_sdpa_top_left, "aligns the causal mask top-left"),
    (lambda *a: absorbed(*a, mask="strict"), "hides each query from its own token"),
    (lambda *a: absorbed(*a, uv=False), "apply W_uv"),
    (_decompressed_by_hand, "formed per-head keys"),
    (_values_per_head, "formed per-head values"),
    (_mqa_helpers, "mqa_(inputs|attention), " + LIBRARY),
    (lambda *a: mla.decompressed(*a), REFERENCE),
    (_scales_in_place, "changed its input latent"),
    (lambda *a: absorbed(*a).tolist(), "returned list"),
]


# ---------------------------------------------------------------- 14.3
def gather(kv_, row, length, index=None):
    page = kv_.shape[1]
    t = torch.arange(length)
    blocks = row.long() if index is None else index(row.long())
    return kv_[blocks[t // page], t % page]


def _paged_kv_cheat(kv_, row, length):
    cache = paged_kv.PagedKVCache(kv_.shape[0], kv_.shape[1], kv_.shape[2], dtype=kv_.dtype)
    cache.storage[0] = kv_
    n = -(-length // kv_.shape[1])
    cache.add(0)
    cache.reserve(0, length)
    cache._seq(0).blocks = row.tolist()[:n]
    return cache.gather(0)


def _added_not_scaled(kv_, row, length):
    t = torch.arange(length)
    return kv_.reshape(-1, kv_.shape[2])[row.long()[t // kv_.shape[1]] + t % kv_.shape[1]]


def _zeroes_the_cache(kv_, row, length):
    out = gather(kv_, row, length).clone()
    kv_.zero_()
    return out


GATHER = [
    (lambda kv_, row, n: kv_[row.long()[:-(-n // kv_.shape[1])]].reshape(-1, kv_.shape[2]), "whole blocks"),
    (lambda kv_, row, n: kv_[row.long()].reshape(-1, kv_.shape[2]), "every block of table_row"),
    (lambda kv_, row, n: kv_[row.long()[:n // kv_.shape[1]]].reshape(-1, kv_.shape[2]),
     "dropped the partial last block"),
    (lambda kv_, row, n: gather(kv_, row, n + 1), "one token too many"),
    (lambda kv_, row, n: kv_.reshape(-1, kv_.shape[2])[:n], "you read logical blocks"),
    (lambda kv_, row, n: gather(kv_, row, n, index=torch.argsort), "you inverted the table"),
    (_added_not_scaled, "without multiplying it by block_size"),
    (lambda kv_, row, n: kv_.reshape(-1, kv_.shape[2])[row.long()[torch.arange(n) // 64] * kv_.shape[1]
                                                       + torch.arange(n) % 64], "assumed blocks of 64"),
    (lambda kv_, row, n: gather(kv_, row, n).T, r"\(width, length\), transposed"),
    (lambda kv_, row, n: gather(kv_, row, n).float(), "returned torch.float32"),
    (_zeroes_the_cache, "changed kv_cache"),
    (_paged_kv_cheat, LIBRARY),
    (lambda kv_, row, n: mla_decode.gather_sequence(kv_, row[None], 0, n), REFERENCE),
]


# ---------------------------------------------------------------- 14.4
def intensity(B, A, W, T, kvb, af, flops=None, nbytes=None):
    f = B * (2 * A + T * af) if flops is None else flops(B, A, W, T, kvb, af)
    n = W + B * T * kvb if nbytes is None else nbytes(B, A, W, T, kvb, af)
    return f / n


INTENSITY = [
    (lambda *a: intensity(*a, nbytes=lambda B, A, W, T, kvb, af: W), "leaves the KV cache out of the bytes"),
    (lambda *a: intensity(*a, nbytes=lambda B, A, W, T, kvb, af: B * (W + T * kvb)), "once per sequence"),
    (lambda *a: intensity(*a, flops=lambda B, A, W, T, kvb, af: B * (A + T * af / 2)), "one FLOP per multiply-add"),
    (lambda *a: intensity(*a, flops=lambda B, A, W, T, kvb, af: 2 * B * A), "leaves out the attention's FLOPs"),
    (lambda *a: intensity(*a, nbytes=lambda B, A, W, T, kvb, af: W + B * kvb), "one cached token per sequence"),
    (lambda *a: intensity(*a, nbytes=lambda B, A, W, T, kvb, af: W + T * kvb), "one sequence's cache for the whole"),
    (lambda *a: intensity(*a, flops=lambda B, A, W, T, kvb, af: 2 * B * A + T * af),
     "attention's FLOPs once for the batch"),
    (lambda *a: intensity(*a, flops=lambda B, A, W, T, kvb, af: 2 * A + T * af), "counts one sequence's FLOPs"),
    (lambda *a: intensity(*a, flops=lambda B, A, W, T, kvb, af: B * (2 * W + T * af)), "counts FLOPs for all the "
                                                                                       "weights"),
    (lambda *a: intensity(*a, flops=lambda B, A, W, T, kvb, af: B * (2 * A + 2 * T * af)),
     "doubles the attention's FLOPs"),
    (lambda *a: 1 / intensity(*a), "is bytes per FLOP"),
    (lambda *a: lab14.mc.intensity_reference(*a), CHECKER),
]


# ---------------------------------------------------------------- 14.6
def _finish_from_library(running, waiting, free_blocks, block_size, max_batch):
    running, _, free_blocks = scheduler.Scheduler().finish(running, free_blocks, block_size)
    return schedule_step(running, waiting, free_blocks, block_size, max_batch)


SCHEDULE = [(_scheduler_as_learner(cls), re.escape(why)) for cls, why in lc.SCHEDULER_MISTAKES] + [
    (lambda *a: schedule_step(*a)[:3], re.escape("expected a tuple (running, waiting, finished, free_blocks)")),
    (lambda *a: scheduler.schedule_step(*a), REFERENCE),
    (_finish_from_library, LIBRARY),
]


# ---------------------------------------------------------------- 14.7
DECODE = [(DecodeAnswer(flags), re.escape(why)) for flags, why in lc.DECODE_MISTAKES] + [
    (lambda *a: paged_mla_decode(*a).transpose(1, 2), r"= \(B, S, H, v_dim\)"),
    (lambda *a: mla_decode.paged_mla(*a), REFERENCE),
    (functools.partial(mla_decode.paged_mla), REFERENCE),           # the reference itself, under another wrapper
    (lambda *a: lc.decode_variant(dict(zip(lc.DECODE_ARGS, a))), CHECKER),
]


# ---------------------------------------------------------------- 14.8
PREFIX = [(_prefix_as_learner(cls), re.escape(why)) for cls, why in lc.PREFIX_MISTAKES] + [
    ((lambda st, t: allocate(st, t)[1:], release), re.escape("expected (state, blocks, hit_tokens)")),
    ((allocate, lambda st, b: None), "return the CacheState you were given"),
    ((lambda st, t: prefix_cache.allocate(st, t), release), REFERENCE),
]


def one_thread(check, pair=False):
    """The checker run with one torch thread (small tensors: on a busy 2-core machine two OpenMP threads made 14.2's
    16 entries take 15 s instead of 0.05 s); `pair`: the wrong answer is (allocate, release)."""
    def run(wrong, seed=None):
        with ceilings.threads(1):
            return check(*wrong, seed=seed) if pair else check(wrong, seed=seed)
    run.exercise = check.exercise
    return run


# ---------------------------------------------------------------- warm-ups
def _names_parent_first(tokens, bs):
    names, parent = [], None
    for i in range(len(tokens) // bs):
        names.append(parent)
        parent = hash((parent, tuple(tokens[i * bs:(i + 1) * bs])))
    return names


def _names_clear(tokens, bs):
    out = block_names(tokens, bs)
    tokens.clear()
    return out


NAMES = [
    (lambda t, bs: [hash(tuple(t[i * bs:(i + 1) * bs])) for i in range(len(t) // bs)], "by its own tokens only"),
    (lambda t, bs: block_names(t + [0] * (-len(t) % bs), bs), "named the partial last block"),
    (lambda t, bs: block_names(t[:-1], bs), "name every full block"),
    (lambda t, bs: [hash(tuple(t[:(i + 1) * bs])) for i in range(len(t) // bs)], "hashes the whole prefix"),
    (_swapped, "the parent's name comes first"),
    (lambda t, bs: block_names(t, bs)[:1] + [hash((i, tuple(t[i * bs:(i + 1) * bs]))) for i in range(1, len(t) // bs)],
     re.escape("is not hash((names[")),
    (_names_parent_first, "appended the parent before"),
    (lambda t, bs: [hash(len(t))] * (len(t) // bs), "first block's name changed|not hash"),
    (_names_clear, "changed the token list"),
    (lambda t, bs: "names", "expected a list of names"),
    (lambda t, bs: [prefix_cache.PrefixCachePolicy().name(None, t[:bs])] + block_names(t, bs)[1:], REFERENCE),
]
MASK = [(_as_mask(wrong), re.escape(why)) for wrong, why in wc.MASK_MISTAKES] + [
    (lambda n, s, p: new_token_mask(n, s, p).T, re.escape("is (positions, s_q)")),
    (lambda n, s, p: torch.zeros(s, len(p)).masked_fill(~new_token_mask(n, s, p), -math.inf), "an additive mask"),
    (lambda n, s, p: new_token_mask(n, s, p).tolist(), "expected a bool tensor"),
    (lambda n, s, p: mla.causal_keep(s, n)[:, p.clamp(max=n - 1)] & (p < n), REFERENCE),
]
HITS = [(wrong, re.escape(why)) for wrong, why in wc.HIT_MISTAKES] + [
    (lambda nm, c, n, bs: [hit_tokens(nm, c, n, bs)], "returned list"),
    (lambda nm, c, n, bs: wc.hit_right(nm, c, n, bs), CHECKER),
    (functools.partial(wc.hit_right), CHECKER),                       # the checker's right answer, wrapped
]

WRONG = {
    one_thread(lab14.check_kv_bytes_per_token): KV,
    one_thread(lab14.check_absorbed_attention): ABSORBED,
    one_thread(lab14.check_gather_paged): GATHER,
    one_thread(lab14.check_decode_intensity): INTENSITY,
    one_thread(lab14.check_schedule_step): SCHEDULE,
    one_thread(lab14.check_paged_mla_decode): DECODE,
    one_thread(lab14.check_prefix_cache, pair=True): PREFIX,
    one_thread(lab14.check_new_token_mask): MASK,
    one_thread(lab14.check_block_names): NAMES,
    one_thread(lab14.check_hit_tokens): HITS,
}



DECODE.append((functools.partial(_gathered, decompressed=True), "formed per-head keys"))

"""Exercise 14.7 (the paged MLA decode loop): cases of paged MLA decoding and the named mistakes, as one block-by-block
loop with switches."""
from __future__ import annotations

import math

import torch

from common.core.checks import fail
from common.kernels import mla

DECODE_ARGS = ("q_nope", "q_rope", "kv_cache", "block_table", "seq_lens", "w_uk", "w_uv", "scale")


def decode_case(gen, heads, kv_lora, nope, rope, v_dim, page, lens, s_q, mscale=1.0, q_gain=1.0) -> dict:
    """Float64 inputs of a paged decode step: the sequences' blocks dealt through a pool with spare blocks so that
    no logical block j lives in physical block j (reading the cache without the table never matches by chance)."""
    need = [-(-n // page) for n in lens]
    blocks = sum(need) + 3
    while True:
        perm = torch.randperm(blocks, generator=gen)
        table = torch.zeros(len(lens), max(need), dtype=torch.int32)
        i = 0
        for b, n in enumerate(need):
            table[b, :n] = perm[i:i + n]
            i += n
        if all(int(table[b, j]) != j for b, n in enumerate(need) for j in range(n)):
            break

    def r(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std
    return {"q_nope": r(len(lens), s_q, heads, nope, std=q_gain), "q_rope": r(len(lens), s_q, heads, rope, std=q_gain),
            "kv_cache": r(blocks, page, kv_lora + rope), "block_table": table,
            "seq_lens": torch.tensor(lens, dtype=torch.int32),
            "w_uk": r(heads, nope, kv_lora, std=kv_lora ** -0.5), "w_uv": r(heads, kv_lora, v_dim, std=kv_lora ** -0.5),
            "scale": mscale ** 2 / (nope + rope) ** 0.5}


def decode_cases(cases) -> list:
    """(case, is_random, label): fixed small cases (MTP's 2 tokens, a length of one token, lengths that are not
    whole blocks), DeepSeek-V3's widths with its YaRN scale, scores large enough to overflow an exp, random ones."""
    g = torch.Generator().manual_seed(147)
    v3 = mla.MLADims(4, 512, 128, 64, 128, mla.yarn_mscale(40))
    out = [(decode_case(g, 3, 16, 6, 8, 5, 4, [9, 4, 13], 2, mscale=1.2), False, "MTP, 2 new tokens"),
           (decode_case(g, 2, 12, 4, 4, 3, 3, [1, 7], 1, mscale=1.1), False, "one new token"),
           (decode_case(g, 4, 512, 128, 64, 128, 64, [70, 129], 2, mscale=v3.mscale), False,
            "V3's widths (4 of its heads), pages of 64, YaRN scale"),
           (decode_case(g, 2, 8, 4, 4, 3, 4, [10, 6], 2, mscale=1.3, q_gain=800.0), False,
            "scores in the thousands")]
    rng = cases.rng
    for _ in range(3):
        s_q = rng.choice([1, 2])
        lens = [rng.randint(s_q, 30) for _ in range(rng.randint(1, 4))]
        out.append((decode_case(cases.gen, rng.randint(2, 5), rng.choice([8, 12, 20]), rng.choice([4, 8]),
                                rng.choice([4, 6]), rng.choice([3, 7]), rng.choice([2, 3, 4, 5]), lens, s_q,
                                mscale=rng.uniform(1.0, 1.5)), True, "random"))
    return out


def decode_variant(c, rope=True, scale="given", causal="right", table=True, clip=True, rescale=True, normalise=True,
                   heads_softmax=False, same_len=False):
    """The decode loop in float64, block by block with an online softmax, with switches for the named mistakes."""
    q_nope, q_rope, kv, bt, lens, w_uk, w_uv = (c[k] for k in DECODE_ARGS[:-1])
    B, S, H, nope = q_nope.shape
    page, kv_lora = kv.shape[1], w_uk.shape[2]
    sc = {"given": c["scale"], "latent": (kv.shape[2]) ** -0.5, "head": (nope + q_rope.shape[3]) ** -0.5,
          "none": 1.0}[scale]
    out = []
    for b in range(B):
        n = int(lens[0] if same_len else lens[b])
        q_lat = torch.einsum("shd,hdc->shc", q_nope[b], w_uk)
        pos = {"right": n - S + torch.arange(S), "none": torch.full((S,), n - 1), "excl": n - S + torch.arange(S) - 1,
               "front": torch.arange(S)}[causal if clip else "none"]      # no clip: no mask either (one token)
        if heads_softmax:
            t = torch.arange(n)
            cache = kv[bt[b, t // page].long(), t % page]
            s = (torch.einsum("shc,tc->sht", q_lat, cache[:, :kv_lora])
                 + torch.einsum("shr,tr->sht", q_rope[b], cache[:, kv_lora:])) * sc
            p = torch.softmax(s.masked_fill(t[None, None] > pos[:, None, None], -math.inf), dim=1)
            p = torch.nan_to_num(p)
            out.append(torch.einsum("shc,hcv->shv", torch.einsum("sht,tc->shc", p, cache[:, :kv_lora]), w_uv))
            continue
        m = torch.full((S, H), -math.inf, dtype=torch.float64)
        den = torch.zeros(S, H, dtype=torch.float64)
        acc = torch.zeros(S, H, kv_lora, dtype=torch.float64)
        for j in range(-(-n // page)):
            blk = kv[int(bt[b, j]) if table else j]
            blk = blk[: n - j * page] if clip else blk
            pos = pos if clip else torch.full((S,), 10 ** 9)
            s = (torch.einsum("shc,tc->sht", q_lat, blk[:, :kv_lora])
                 + (torch.einsum("shr,tr->sht", q_rope[b], blk[:, kv_lora:]) if rope else 0)) * sc
            t = j * page + torch.arange(blk.shape[0])
            s = s.masked_fill(t[None, None] > pos[:, None, None], -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            alpha = torch.exp(m - m_new) if rescale else torch.ones_like(m)
            p = torch.exp(s - m_new[..., None])
            den = den * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + torch.einsum("sht,tc->shc", p, blk[:, :kv_lora])
            m = m_new
        o = acc / den[..., None] if normalise else acc
        out.append(torch.einsum("shc,hcv->shv", o, w_uv))
    return torch.stack(out)


DECODE_MISTAKES = [
    (dict(rope=False), "leaves out the RoPE part of the scores: q_rope . k_rope belongs beside q_lat . latent"),
    (dict(scale="latent"), "scales by 1/sqrt(kv_lora + rope), the width of the cached row; use the scale argument "
                           "(the original head's, with YaRN's mscale)"),
    (dict(scale="head"), "recomputes the scale as 1/sqrt(nope + rope) and so drops YaRN's mscale: use the scale "
                         "argument"),
    (dict(scale="none"), "leaves out the softmax scale"),
    (dict(causal="none"), "is not causal across MTP's new tokens: new token s sits at position seq_lens[b] - S + s and "
                          "must not see the tokens after it"),
    (dict(causal="excl"), "hides each new token from itself: the token at position p attends keys 0..p"),
    (dict(causal="front"), "places the new tokens at positions 0..S-1; they are the last S tokens of the sequence"),
    (dict(table=False), "reads block j of the cache instead of block block_table[b, j]: the table maps a sequence's "
                        "blocks to physical ones"),
    (dict(clip=False), "attends the unused slots of the last block (no mask, no cut): a sequence ends at "
                       "seq_lens[b]"),
    (dict(rescale=False), "does not rescale the running sum and output when the running max grows (multiply them by "
                          "exp(m_old - m_new))"),
    (dict(normalise=False), "does not divide by the softmax's sum at the end"),
    (dict(heads_softmax=True), "normalises the softmax over the heads instead of over the cached tokens"),
    (dict(same_len=True), "uses the first sequence's length for every sequence"),
]


def name_decode_mistake(c, got, where: str) -> None:
    """Fail naming the first switched mistake whose output the learner's matches."""
    for flags, why in DECODE_MISTAKES:
        try:
            wrong = decode_variant(c, **flags)
        except (IndexError, RuntimeError):     # a misreading out of this case's bounds
            continue
        if torch.allclose(got, wrong, rtol=1e-6, atol=1e-9, equal_nan=True):
            fail(f"{where}: your output {why}")




class DecodeAnswer:
    """A named mistake as a function of the exercise's arguments (for the tests: the grader refuses it as the
    checker's own code)."""

    def __init__(self, flags: dict):
        if not flags:
            raise ValueError("DecodeAnswer stands for a named mistake: give it the flags of one")
        self.flags = flags

    def __call__(self, *args):
        return decode_variant(dict(zip(DECODE_ARGS, args)), **self.flags)

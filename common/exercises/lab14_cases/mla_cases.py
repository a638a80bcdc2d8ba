"""Exercises 14.1-14.4 (KV bytes, absorbed MLA, the block-table gather, decode intensity): the named mistakes of each
and the judges that name them.

A number's mistake is named only when it explains the learner's answer on EVERY case where it applies (one case alone
cannot tell "counts K or V alone" from "uses the group size as the KV heads" on Mixtral, whose group size is half its
KV heads); a tensor's mistake is named on the first case where it matches, the cases being drawn so that no two
mistakes give the same tensor."""
from __future__ import annotations

import torch

from common.core.checks import expect_close, fail, near
from common.kernels import mla
from common.systems.inference import kvcache


# ---------------------------------------------------------------- numbers: 14.1, 14.4

def name_number_mistake(rows: list, rtol: float) -> None:
    """rows: [(where, got, expected, {why: value of that mistake, for the mistakes that apply to the case})]. Fail
    naming the first mistake that gives the learner's answer on every case it applies to (and is wrong on one of
    them); else fail on the first wrong case, expected vs got."""
    wrong = [r for r in rows if not near(r[1], r[2], rtol)]
    if not wrong:
        return
    order = list(dict.fromkeys(why for r in rows for why in r[3]))
    for why in order:
        applies = [r for r in rows if why in r[3]]
        if all(near(got, m[why], rtol) or (near(got, exp, rtol) and near(m[why], exp, rtol))
               for _, got, exp, m in applies) and any(not near(got, exp, rtol) for _, got, exp, _ in applies):
            where, got, exp, _ = next(r for r in applies if not near(r[1], r[2], rtol))
            fail(f"{where} = {got:.10g}: that {why} (expected {exp:.10g})")
    where, got, exp, _ = wrong[0]
    expect_close(got, exp, where, rtol=rtol, atol=0.0)


def kv_reference(cfg, b) -> float:
    L = cfg["num_hidden_layers"]
    if cfg["attention"] == "mla":
        return kvcache.mla_bytes_per_token(L, cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], b)
    return kvcache.kv_bytes_per_token(L, cfg["num_key_value_heads"], cfg["head_dim"], cfg["head_dim"], b)


def kv_mistakes(cfg, b, expected) -> dict:
    """{why: value} of the named mistakes of 14.1 that apply to this config."""
    L, nh = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    moe_layers = L - (cfg["first_k_dense_replace"] or 0)
    if cfg["attention"] == "mla":
        qk, vd, lat, rope = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"], cfg["v_head_dim"], \
            cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
        out = {"leaves out the decoupled RoPE key MLA caches beside the latent": L * lat * b,
               "caches the latent twice (as K and as V); MLA recovers both from ONE latent": L * (2 * lat + rope) * b,
               "is the MHA-equivalent cache (K and V of every head); MLA caches the compressed latent instead":
                   L * nh * (qk + vd) * b,
               "caches a latent per query head; MLA's latent (and its RoPE key) is shared by all heads":
                   L * nh * (lat + rope) * b}
    else:
        kv, hd = cfg["num_key_value_heads"], cfg["head_dim"]
        out = {"caches K and V for all the query heads (num_attention_heads); grouped-query attention caches only "
               "num_key_value_heads of them": L * nh * 2 * hd * b,
               "uses the group size (num_attention_heads / num_key_value_heads, the query heads per KV head) as "
               "the number of KV heads; the cache holds num_key_value_heads heads": L * (nh // kv) * 2 * hd * b,
               "counts K or V alone; both are cached": expected / 2}
    out.update({"is one layer's cache; every layer caches its own": expected / L,
                "counts only the MoE layers (after first_k_dense_replace); the dense layers have attention and a "
                "cache too": expected / L * moe_layers,
                "counts values, not bytes: multiply by bytes_per_value": expected / b,
                "uses 2 bytes per value whatever bytes_per_value says": expected / b * 2,
                "is in bits, not bytes": expected * 8})
    return out


def intensity_reference(B, A, W, T, kvb, af) -> float:
    return B * (2 * A + T * af) / (W + B * T * kvb)


def intensity_mistakes(B, A, W, T, kvb, af) -> dict:
    return {
        "leaves the KV cache out of the bytes: each sequence reads its own cache, so the intensity stops growing "
        "with the batch": B * (2 * A + T * af) / W,
        "reads the weights once per sequence; the batch shares one read of the weights":
            B * (2 * A + T * af) / (B * W + B * T * kvb),
        "counts one FLOP per multiply-add; a multiply-add is 2": B * (A + T * af / 2) / (W + B * T * kvb),
        "leaves out the attention's FLOPs over the cached tokens": B * 2 * A / (W + B * T * kvb),
        "reads one cached token per sequence; the step reads all `context` of them":
            B * (2 * A + T * af) / (W + B * kvb),
        "reads one sequence's cache for the whole batch; each sequence reads its own":
            B * (2 * A + T * af) / (W + T * kvb),
        "counts the attention's FLOPs once for the batch; each sequence attends its own cache":
            (B * 2 * A + T * af) / (W + B * T * kvb),
        "counts one sequence's FLOPs; the step computes a token for each of the `batch` sequences":
            (2 * A + T * af) / (W + B * T * kvb),
        "counts FLOPs for all the weights (weight_bytes as parameters); a token works only through its "
        "active_params": B * (2 * W + T * af) / (W + B * T * kvb),
        "doubles the attention's FLOPs: attn_flops_per_kv_token already counts FLOPs, not multiply-adds":
            B * (2 * A + 2 * T * af) / (W + B * T * kvb),
        "is bytes per FLOP; arithmetic intensity is FLOPs per byte": (W + B * T * kvb) / (B * (2 * A + T * af)),
    }


# ---------------------------------------------------------------- tensors: 14.2

def mla_dims_ok(d, T: int, Q: int) -> bool:
    """True when no legitimate tensor of the absorbed form (scores, latents, masks, queries) has a shape that reads
    as the per-head keys or values (T with nope, v_dim, H x nope or H x v_dim): the guard below cannot misfire."""
    H = d.heads
    bad = {d.nope, d.v_dim, H * d.nope, H * d.v_dim}
    legit = {1, Q, H, Q * H, d.kv_lora, d.rope, d.kv_lora + d.rope, H * d.kv_lora, H * d.rope,
             H * (d.kv_lora + d.rope), Q * d.kv_lora, Q * H * d.kv_lora, Q * d.rope, Q * H * d.rope, Q * d.v_dim,
             Q * H * d.v_dim, Q * d.nope, Q * H * d.nope}
    return not (bad & legit) and T not in bad | legit and T > Q


def per_head_guard(T: int, d):
    """A TorchFunctionMode that records the first tensor produced with a token axis (T) beside per-head widths:
    keys (T, nope) or values (T, v_dim) of one head, or of all heads -- the decompressed form."""
    widths = {d.nope: "keys", d.heads * d.nope: "keys", d.v_dim: "values", d.heads * d.v_dim: "values"}

    def judge(shape, numel):
        return widths.get(numel // T) if T in shape and len(shape) >= 2 else None
    return shape_guard(judge)


def decode_guard(c: dict):
    """14.7's guard: a tensor with a nope or v_dim axis whose other axes are not made of the batch, the heads, the
    latent's widths and the cache's and table's shapes holds keys or values per token and head (the decompressed
    form). None when the case's widths collide (the guard could misfire)."""
    B, S, H, nope = c["q_nope"].shape
    kv_lora, rope, v_dim = c["w_uk"].shape[2], c["q_rope"].shape[3], c["w_uv"].shape[2]
    parts = [B, S, H, kv_lora, rope, kv_lora + rope, *c["kv_cache"].shape[:2], c["block_table"].shape[1]]
    if {nope, v_dim} & set(parts) or 1 in (nope, v_dim):
        return None
    legit = {1}
    for p in parts:
        legit |= {x * p for x in legit}
    widths = {nope: "keys", v_dim: "values"}

    def judge(shape, numel):
        for n, label in widths.items():
            if n in shape and numel // n not in legit:
                return label
        return None
    return shape_guard(judge)


def shape_guard(judge):
    """A TorchFunctionMode whose `seen` is (function, shape, judge's label) of the first tensor produced that
    `judge(shape, numel)` labels."""
    from torch.overrides import TorchFunctionMode

    class Guard(TorchFunctionMode):
        seen = None

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if self.seen is None and isinstance(t, torch.Tensor) and t.dim() >= 2:
                    label = judge(tuple(t.shape), t.numel())
                    if label:
                        self.seen = (getattr(func, "__name__", str(func)), tuple(t.shape), label)
            return out
    return Guard()


def decompressed_verdict(where: str, seen) -> str:
    return (f"{where}: {seen[0]} formed per-head {seen[2]} of shape {seen[1]} -- that is the decompressed form "
            f"(latent x W_{'uk' if seen[2] == 'keys' else 'uv'} per token and head); absorb W_uk into the query, "
            f"attend the latent itself, and apply W_uv after the attention")


def scores_variant(c, scale, rope=True, causal="right", softmax_over="keys", scale_rope=True):
    q_lat = torch.einsum("qhd,hdc->qhc", c["q_nope"], c["w_uk"])
    s = torch.einsum("qhc,tc->hqt", q_lat, c["latent"]) * scale
    if rope:
        s = s + torch.einsum("qhr,tr->hqt", c["q_rope"], c["k_rope"]) * (scale if scale_rope else 1.0)
    Q, T = s.shape[1], s.shape[2]
    t, i = torch.arange(T)[None, :], torch.arange(Q)[:, None]
    keep = {"right": t <= T - Q + i, "none": torch.ones(Q, T, dtype=torch.bool), "top_left": t <= i,
            "strict": t < T - Q + i}[causal]
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, -1) if softmax_over == "keys" else torch.nan_to_num(torch.softmax(s, 1), nan=0.0)
    o = torch.einsum("hqt,tc->qhc", p, c["latent"])
    return torch.einsum("qhc,hcv->qhv", o, c["w_uv"])


def absorbed_mistakes(c, d) -> list:
    """[(output, why)] of 14.2's named mistakes on case c."""
    Q = c["q_nope"].shape[0]
    out = [(scores_variant(c, d.scale, rope=False), "the RoPE scores q_rope . k_rope are missing"),
           (scores_variant(c, (d.kv_lora + d.rope) ** -0.5), "scales by 1/sqrt(kv_lora + rope); the scale stays the "
                                                             "original head's 1/sqrt(nope + rope)"),
           (scores_variant(c, d.kv_lora ** -0.5), "scales by 1/sqrt(kv_lora); the scale stays the original head's "
                                                  "1/sqrt(nope + rope)"),
           (scores_variant(c, 1.0), "leaves out the softmax scale"),
           (scores_variant(c, d.scale, scale_rope=False), "scales only the latent part of the scores; the RoPE part "
                                                          "q_rope . k_rope is scaled too"),
           (scores_variant(c, d.scale, softmax_over="queries"), "normalises the softmax over the queries; each "
                                                                "query's weights sum to 1 over the cached tokens")]
    if Q > 1:
        out.append((scores_variant(c, d.scale, causal="none"),
                    "is not causal: query i (at position T - Q + i) must not see later tokens"))
    out += [(scores_variant(c, d.scale, causal="top_left"),
             "aligns the causal mask top-left (query i sees keys 0..i, as SDPA's is_causal does): the queries are "
             "the LAST Q tokens, query i sits at T - Q + i"),
            (scores_variant(c, d.scale, causal="strict"),
             "hides each query from its own token: query i attends keys 0..T - Q + i, itself included (<=, not <)")]
    return out


def judge_absorbed(got, c, d, expected, where: str) -> None:
    got = got.double()
    for value, why in absorbed_mistakes(c, d):
        if torch.allclose(got, value, rtol=1e-6, atol=1e-9) and not torch.allclose(value, expected, atol=1e-9):
            fail(f"{where}: your output {why}")


# ---------------------------------------------------------------- tensors: 14.3

def gather_misreadings(kv, row, length) -> list:
    """[(tensor, why)] of 14.3's named misreadings that stay in bounds on this cache."""
    page, w = kv.shape[1], kv.shape[2]
    flat, t = kv.reshape(-1, w), torch.arange(length)
    n = -(-length // page)
    r = row.long()
    out = [(flat[:length], f"you read logical blocks 0..{n - 1} of kv_cache (or the table's blocks in sorted "
                           f"order); the sequence's block j is physical block table_row[j]"),
           (flat[(r[t // page] + t % page).clamp(max=flat.shape[0] - 1)],
            "you added the physical block number to the offset without multiplying it by block_size: token t "
            "is row table_row[t // block_size] x block_size + t % block_size of the flattened cache")]
    if page != 64:
        out.append((flat[r[t // 64] * page + t % 64],
                    f"you assumed blocks of 64 tokens; this cache's blocks hold {page} (kv_cache.shape[1])"))
    inverse = torch.argsort(r)
    if int(inverse[:n].max()) < kv.shape[0]:
        out.append((kv[inverse[t // page], t % page], "you inverted the table (looked up where physical block j "
                                                      "sits); table_row[j] IS the physical block of logical block j"))
    return out


def judge_gather_shape(got, kv, row, length, expected, where: str) -> None:
    """Name a wrong number of rows (or a transposed result) before the values are compared."""
    page, rows = kv.shape[1], got.shape[0] if got.dim() else 0
    if got.dim() == 2 and tuple(got.shape) == (kv.shape[2], length) and length != kv.shape[2]:
        fail(f"{where}: shape {tuple(got.shape)} is (width, length), transposed; return one row per token")
    if rows == -(-length // page) * page and rows != length:
        fail(f"{where}: {rows} rows -- whole blocks; the last block holds only {length % page or page} of this "
             f"sequence's tokens: keep the first `length`")
    if rows == len(row) * page and rows != length:
        fail(f"{where}: {rows} rows -- every block of table_row; the sequence has ceil(length / block_size) = "
             f"{-(-length // page)} blocks, and its first `length` tokens are the answer")
    if rows == length // page * page and rows != length:
        fail(f"{where}: {rows} rows -- you dropped the partial last block (length // block_size blocks, rounded "
             f"down); its first {length % page} tokens belong to the sequence")
    if rows in (length - 1, length + 1):
        fail(f"{where}: {rows} rows for length={length}: one token {'short' if rows < length else 'too many'} -- "
             f"return tokens 0..length-1")
    if tuple(got.shape) != tuple(expected.shape):
        fail(f"{where}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
    if got.dtype != kv.dtype:
        fail(f"{where}: returned {got.dtype}; the cache holds {kv.dtype} -- return its rows as they are")

"""Lab 14 checkers: right answers pass, each classic mistake fails with a telling message, stubs are not attempted."""
import math

import pytest
import torch

from common.core.checks import CheckFailed
from common.exercises.lab14 import (check_absorbed_attention, check_cost_per_m_tokens, check_decode_intensity,
                                    check_gather_paged, check_kv_bytes_per_token)


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise: replace this line with your code")


# ---- 14.1
def right_kv(cfg, b, rope=True, twice=False, one_layer=False, all_heads=False, mha=False, half=False, fixed=None):
    b = fixed or b
    L = 1 if one_layer else cfg["num_hidden_layers"]
    if cfg["attention"] == "mla":
        if mha:
            return L * cfg["num_attention_heads"] * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] +
                                                     cfg["v_head_dim"]) * b
        lat = cfg["kv_lora_rank"] * (2 if twice else 1)
        return L * (lat + (cfg["qk_rope_head_dim"] if rope else 0)) * b
    heads = cfg["num_attention_heads"] if all_heads else cfg["num_key_value_heads"]
    return L * heads * cfg["head_dim"] * (1 if half else 2) * b


def test_kv_bytes_right_and_stub():
    v = check_kv_bytes_per_token(right_kv)
    assert v.passed and "70,272" in v.detail
    assert check_kv_bytes_per_token(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda c, b: right_kv(c, b, rope=False), r"leaves out the decoupled RoPE key"),
    (lambda c, b: right_kv(c, b, twice=True), r"caches the latent twice"),
    (lambda c, b: right_kv(c, b, mha=True), r"MHA-equivalent"),
    (lambda c, b: right_kv(c, b, one_layer=True), r"one layer's cache"),
    (lambda c, b: right_kv(c, b, all_heads=True), r"all 64 query heads"),
    (lambda c, b: right_kv(c, b, half=True), r"K or V alone"),
    (lambda c, b: right_kv(c, 1), r"counts values, not bytes"),
    (lambda c, b: right_kv(c, b, fixed=2), r"2 bytes per value whatever"),
    (lambda c, b: right_kv(c, b) * 8, r"in bits"),
    (lambda c, b: 70272.0, r"Llama-3-70B"),                         # ignores the config
    (lambda c, b: "70272", r"returned str"),
])
def test_kv_bytes_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_kv_bytes_per_token(wrong)


def test_kv_bytes_refuses_the_reference():
    from common.systems.inference import kvcache

    def calls_reference(cfg, b):
        return kvcache.mla_bytes_per_token(cfg["num_hidden_layers"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], b) \
            if cfg["attention"] == "mla" else right_kv(cfg, b)
    with pytest.raises(CheckFailed, match=r"the reference this exercise asks you to write"):
        check_kv_bytes_per_token(calls_reference)


# ---- 14.2
def absorbed(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale, rope=True, causal=True, scale_override=None,
             skip_uv=False, dtype=None):
    if dtype is not None:
        q_nope, q_rope, latent, k_rope, w_uk, w_uv = (t.to(dtype) for t in (q_nope, q_rope, latent, k_rope, w_uk, w_uv))
    q_lat = torch.einsum("qhd,hdc->qhc", q_nope, w_uk)
    s = torch.einsum("qhc,tc->hqt", q_lat, latent)
    if rope:
        s = s + torch.einsum("qhr,tr->hqt", q_rope, k_rope)
    s = s * (scale if scale_override is None else scale_override(latent, k_rope, q_nope))
    Q, T = s.shape[1], s.shape[2]
    if causal:
        keep = torch.arange(T)[None, :] <= torch.arange(T - Q, T)[:, None]
        s = s.masked_fill(~keep, float("-inf"))
    o = torch.einsum("hqt,tc->qhc", torch.softmax(s, -1), latent)
    return o if skip_uv else torch.einsum("qhc,hcv->qhv", o, w_uv)


def test_absorbed_right_and_stub():
    v = check_absorbed_attention(absorbed)
    assert v.passed, v
    assert check_absorbed_attention(lambda *a: absorbed(*a, dtype=torch.float32)).passed   # float32 is fine
    assert check_absorbed_attention(stub).status == "not attempted"


def _modifies(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale):
    latent.mul_(1.0)
    q_nope.add_(0.0)
    out = absorbed(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale)
    w_uk.zero_()
    return out


@pytest.mark.parametrize("wrong, match", [
    (lambda *a: absorbed(*a, rope=False), r"RoPE scores"),
    (lambda *a: absorbed(*a, scale_override=lambda lat, kr, qn: (lat.shape[1] + kr.shape[1]) ** -0.5),
     r"1/sqrt\(kv_lora \+ rope\)"),
    (lambda *a: absorbed(*a, scale_override=lambda lat, kr, qn: lat.shape[1] ** -0.5), r"1/sqrt\(kv_lora\)"),
    (lambda *a: absorbed(*a, scale_override=lambda lat, kr, qn: 1.0), r"leaves out the softmax scale"),
    (lambda *a: absorbed(*a, causal=False), r"is not causal"),
    (lambda *a: absorbed(*a, skip_uv=True), r"apply W_uv"),
    (_modifies, r"changed its input w_uk"),
    (lambda *a: absorbed(*a)[:1], r"shape"),
    (lambda *a: absorbed(*a).tolist(), r"returned list"),
])
def test_absorbed_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_absorbed_attention(wrong)


def test_absorbed_refuses_the_references():
    from common.kernels import mla
    with pytest.raises(CheckFailed, match=r"the reference this exercise asks you to write"):
        check_absorbed_attention(lambda qn, qr, lat, kr, uk, uv, s: mla.decompressed(qn, qr, lat, kr, uk, uv, s))
    with pytest.raises(CheckFailed, match=r"the reference this exercise asks you to write"):
        check_absorbed_attention(mla.absorbed)


# ---- 14.3
def right_gather(kv, row, length):
    page = kv.shape[1]
    t = torch.arange(length)
    return kv[row.long()[t // page], t % page]


def test_gather_right_and_stub():
    assert check_gather_paged(right_gather).passed
    assert check_gather_paged(stub).status == "not attempted"


def _whole_blocks(kv, row, length):
    n = -(-length // kv.shape[1])
    return kv[row.long()[:n]].reshape(-1, kv.shape[2])


def _logical(kv, row, length):
    return kv.reshape(-1, kv.shape[2])[:length]


def _page64(kv, row, length):
    t = torch.arange(length)
    return kv.reshape(-1, kv.shape[2])[row.long()[t // 64] * kv.shape[1] + t % 64]


def _one_short(kv, row, length):
    return right_gather(kv, row, length)[:-1] if length > 1 else right_gather(kv, row, length)


@pytest.mark.parametrize("wrong, match", [
    (_whole_blocks, r"whole blocks"),
    (_logical, r"you read logical blocks"),
    (_page64, r"assumed blocks of 64"),
    (_one_short, r"shape"),
    # tokens in reverse order: no named misreading matches it (a reversed table did, when the reversal happened to
    # put logical blocks 0..n-1 first: CI drew such a table)
    (lambda kv, row, n: right_gather(kv, row, n).flip(0), r"elements differ"),
    (lambda kv, row, n: None, r"returned NoneType"),
])
def test_gather_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_gather_paged(wrong)


# ---- 14.4
def right_intensity(B, A, W, T, kvb, af, two=2, kv=True, per_seq=False, attn=True, tokens=True):
    flops = B * (two * A + (T * af * two / 2 if attn else 0))
    nbytes = W * (B if per_seq else 1) + (B * (T if tokens else 1) * kvb if kv else 0)
    return flops / nbytes


def test_intensity_right_and_stub():
    assert check_decode_intensity(right_intensity).passed
    assert check_decode_intensity(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda *a: right_intensity(*a, kv=False), r"leaves the KV cache out"),
    (lambda *a: right_intensity(*a, per_seq=True), r"once per sequence"),
    (lambda *a: right_intensity(*a, two=1), r"one FLOP per multiply-add"),
    (lambda *a: right_intensity(*a, attn=False), r"attention's FLOPs"),
    (lambda *a: right_intensity(*a, tokens=False), r"one cached token per sequence"),
    (lambda B, A, W, T, kvb, af: right_intensity(1, A, W, T, kvb, af), r"decode_intensity\(64"),  # ignores batch
    (lambda B, A, W, T, kvb, af: right_intensity(B, W, W, T, kvb, af), r"decode_intensity\(1, 3.7e\+10"),  # all weights
])
def test_intensity_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_decode_intensity(wrong)


# ---- 14.5
def right_cost(tps, usd, g):
    return usd * g / 3600 / tps * 1e6


def test_cost_right_and_stub():
    v = check_cost_per_m_tokens(right_cost)
    assert v.passed and "0.300" in v.detail
    assert check_cost_per_m_tokens(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda t, u, g: u / 3600 / t * 1e6, r"prices one GPU"),
    (lambda t, u, g: u * g / t * 1e6, r"per GPU-second"),
    (lambda t, u, g: u * g / 3600 / 3600 / t * 1e6, r"divides by 3600 twice"),
    (lambda t, u, g: u * g / 3600 / t * 1e3, r"per thousand"),
    (lambda t, u, g: u * g / 3600 / t, r"per token"),
    (lambda t, u, g: -right_cost(t, u, g), r"positive"),
    (lambda t, u, g: right_cost(t, u, 8), r"cost_per_m_tokens\(1000, 3.5, 4\)"),       # ignores gpus_per_node
])
def test_cost_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_cost_per_m_tokens(wrong)


def test_cost_refuses_the_reference():
    from common.systems.inference import service
    with pytest.raises(CheckFailed, match=r"the reference this exercise asks you to write"):
        check_cost_per_m_tokens(lambda t, u, g: service.cost_per_m_tokens(t, u, g))
    assert math.isclose(service.cost_per_m_tokens(14800, 2, 8), 0.3003003, rel_tol=1e-6)

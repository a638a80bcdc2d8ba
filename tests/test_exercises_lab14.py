"""Lab 14 checkers: right answers pass, each classic mistake fails with a telling message, stubs are not attempted."""
import math
import re

import pytest
import torch

from learner import own_copy

from common.core.checks import CheckFailed
from common.exercises import lab14_cases as lc
from common.exercises.lab14_cases.decode_cases import DecodeAnswer
from common.exercises.lab14 import (check_absorbed_attention, check_cost_per_m_tokens, check_decode_intensity,
                                    check_gather_paged, check_kv_bytes_per_token, check_paged_mla_decode,
                                    check_prefix_cache, check_schedule_step)


pytestmark = pytest.mark.usefixtures("one_thread")   # small tensors: OpenMP threads only contend on a busy CPU


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


def test_kv_bytes_right_answers_written_differently():
    """Right answers by another route: no workbook code, a sum over layers, integers."""
    def per_layer(cfg, b):
        one = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] if cfg["attention"] == "mla"
               else 2 * cfg["num_key_value_heads"] * cfg["head_dim"])
        return float(sum(one * b for _ in range(cfg["num_hidden_layers"])))
    assert check_kv_bytes_per_token(per_layer).passed
    assert check_kv_bytes_per_token(lambda c, b: int(right_kv(c, b)) if float(right_kv(c, b)).is_integer()
                                    else right_kv(c, b)).passed


@pytest.mark.parametrize("wrong, match", [
    (lambda c, b: right_kv(c, b, rope=False), r"leaves out the decoupled RoPE key"),
    (lambda c, b: right_kv(c, b, twice=True), r"caches the latent twice"),
    (lambda c, b: right_kv(c, b, mha=True), r"MHA-equivalent"),
    (lambda c, b: right_kv(c, b, one_layer=True), r"one layer's cache"),
    (lambda c, b: right_kv(c, b, all_heads=True), r"all the query heads"),
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


def _absorbed_by_head(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale):
    """Right: one head at a time, matmuls instead of einsum."""
    Q, T = q_nope.shape[0], latent.shape[0]
    keep = torch.arange(T)[None, :] <= torch.arange(T - Q, T)[:, None]
    out = []
    for h in range(q_nope.shape[1]):
        s = ((q_nope[:, h] @ w_uk[h]) @ latent.T + q_rope[:, h] @ k_rope.T) * scale
        out.append(torch.softmax(s.masked_fill(~keep, -math.inf), -1) @ latent @ w_uv[h])
    return torch.stack(out, 1)


def _absorbed_sdpa(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale):
    """Right: the MQA form through torch's SDPA, with the mask aligned bottom-right by hand."""
    import torch.nn.functional as F
    Q, T = q_nope.shape[0], latent.shape[0]
    q = torch.cat([torch.einsum("qhd,hdc->hqc", q_nope, w_uk), q_rope.transpose(0, 1)], -1)
    kv = torch.cat([latent, k_rope], -1)
    keep = torch.arange(T)[None, :] <= torch.arange(T - Q, T)[:, None]
    o = F.scaled_dot_product_attention(q, kv.expand(q.shape[0], -1, -1), latent.expand(q.shape[0], -1, -1),
                                       attn_mask=keep, scale=scale)
    return torch.einsum("hqc,hcv->qhv", o, w_uv)


def test_absorbed_right_answers_written_differently():
    assert check_absorbed_attention(_absorbed_by_head).passed
    assert check_absorbed_attention(_absorbed_sdpa).passed


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


def test_gather_right_answers_written_differently():
    def by_blocks(kv, row, length):
        page = kv.shape[1]
        parts = [kv[int(row[j])] for j in range(-(-length // page))]
        return torch.cat(parts)[:length]

    def flat_index(kv, row, length):
        t = torch.arange(length)
        return kv.flatten(0, 1)[row.long()[t // kv.shape[1]] * kv.shape[1] + t % kv.shape[1]]
    assert check_gather_paged(by_blocks).passed
    assert check_gather_paged(flat_index).passed


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
    (_one_short, r"one token short"),
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
    per_seq = lambda B, A, W, T, kvb, af: (2 * A + T * af) / (W / B + T * kvb)     # noqa: E731  (per sequence)
    assert check_decode_intensity(per_seq).passed


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


# ---- 14.6: the solution as a learner writes it (the lab's statement: common.systems.inference.scheduler)
def schedule_step(running, waiting, free_blocks, block_size, max_batch):
    def blocks(n):
        return -(-n // block_size)
    finished = [s for s in running if s.generated >= s.max_new]          # 1. finish: their blocks come back
    free_blocks += sum(blocks(s.tokens) for s in finished)
    running, waiting = [s for s in running if s.generated < s.max_new], list(waiting)
    i = 0
    while i < len(running):                                              # 2. grow, oldest first
        need = blocks(running[i].tokens + 1) - blocks(running[i].tokens)
        if need <= free_blocks:
            free_blocks -= need
            i += 1
        else:                                                            # the pool is dry: preempt the newest
            victim = running.pop()
            free_blocks += blocks(victim.tokens)
            waiting.insert(0, victim)
    while waiting and len(running) < max_batch and blocks(waiting[0].tokens + 1) <= free_blocks:
        s = waiting.pop(0)                                               # 3. admit, first come first served
        free_blocks -= blocks(s.tokens + 1)
        running.append(s)
    for s in running:                                                    # 4. every running request: one token
        s.generated += 1
    return running, waiting, finished, free_blocks


def _scheduler_as_learner(cls):
    """A wrong policy as a learner's own code (its step copied, so the reference watch does not see it)."""
    own = type("Learner" + cls.__name__, (cls,), {"step": own_copy(cls.step)})
    return own().step          # passed as it is: a lambda around it would be a learner calling the library


def test_schedule_step_right_and_stub():
    v = check_schedule_step(schedule_step)
    assert v.passed and "30-request trace" in v.detail
    assert check_schedule_step(_scheduler_as_learner(lc.Scheduler)).passed
    assert check_schedule_step(stub).status == "not attempted"


@pytest.mark.parametrize("cls, why", lc.SCHEDULER_MISTAKES, ids=[c.__name__ for c, _ in lc.SCHEDULER_MISTAKES])
def test_schedule_step_wrong_policies_named(cls, why):
    """Each wrong policy is named as itself, whatever the random states (three seeds)."""
    assert len(lc.SCHEDULER_MISTAKES) >= 10
    for seed in (2, 3):                    # seed 1 runs in the audit (tests/wrong_answers/lab14.py)
        with pytest.raises(CheckFailed, match=re.escape(why)):
            check_schedule_step(_scheduler_as_learner(cls), seed=seed)


def test_schedule_step_other_wrong_answers():
    from common.systems.inference import scheduler

    def drops_one(*a):
        running, waiting, finished, free = schedule_step(*a)
        return running, waiting[1:], finished, free
    with pytest.raises(CheckFailed, match=r"the requests changed -- lost"):
        check_schedule_step(drops_one)
    with pytest.raises(CheckFailed, match=r"expected a tuple \(running, waiting, finished, free_blocks\)"):
        check_schedule_step(lambda *a: schedule_step(*a)[:3])
    with pytest.raises(CheckFailed, match=r"the reference this exercise asks you to write"):
        check_schedule_step(lambda *a: scheduler.schedule_step(*a))


# ---- 14.7
def paged_mla_decode(q_nope, q_rope, kv_cache, block_table, seq_lens, w_uk, w_uv, scale):
    B, S, H, _ = q_nope.shape
    page, kv_lora = kv_cache.shape[1], w_uk.shape[2]
    out = []
    for b in range(B):
        n = int(seq_lens[b])
        q_lat = torch.einsum("shd,hdc->shc", q_nope[b], w_uk)                # W_uk absorbed into the query
        pos = n - S + torch.arange(S)                                          # where the new tokens sit
        m = torch.full((S, H), -math.inf, dtype=q_lat.dtype)
        total = torch.zeros(S, H, dtype=q_lat.dtype)
        acc = torch.zeros(S, H, kv_lora, dtype=q_lat.dtype)
        for j in range(-(-n // page)):                                         # the sequence's blocks, in order
            block = kv_cache[int(block_table[b, j])][: n - j * page]
            latent, k_rope = block[:, :kv_lora], block[:, kv_lora:]
            s = (torch.einsum("shc,tc->sht", q_lat, latent) + torch.einsum("shr,tr->sht", q_rope[b], k_rope)) * scale
            t = j * page + torch.arange(block.shape[0])
            s = s.masked_fill(t > pos[:, None, None], -math.inf)              # causal across the new tokens
            m_new = torch.maximum(m, s.amax(-1))                               # online softmax
            alpha, p = torch.exp(m - m_new), torch.exp(s - m_new[..., None])
            total = total * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + torch.einsum("sht,tc->shc", p, latent)
            m = m_new
        out.append(torch.einsum("shc,hcv->shv", acc / total[..., None], w_uv))  # W_uv after the attention
    return torch.stack(out)


def _gathered(q_nope, q_rope, kv_cache, block_table, seq_lens, w_uk, w_uv, scale, dtype=torch.float64,
              decompressed=False):
    """Right too: each sequence gathered whole, then one softmax (not block by block), in `dtype`. `decompressed`:
    per-head keys and values formed, the form the exercise forbids."""
    a = [x.to(dtype) for x in (q_nope, q_rope, kv_cache, w_uk, w_uv)]
    q_nope, q_rope, kv_cache, w_uk, w_uv = a
    S, page, kv_lora = q_nope.shape[1], kv_cache.shape[1], w_uk.shape[2]
    out = []
    for b in range(q_nope.shape[0]):
        n = int(seq_lens[b])
        t = torch.arange(n)
        cache = kv_cache[block_table[b, t // page].long(), t % page]
        if decompressed:
            keys, values = (torch.einsum("tc,hdc->htd", cache[:, :kv_lora], w_uk),
                            torch.einsum("tc,hcv->htv", cache[:, :kv_lora], w_uv))
            nope_scores = torch.einsum("shd,htd->sht", q_nope[b], keys)
        else:
            nope_scores = torch.einsum("shd,hdc,tc->sht", q_nope[b], w_uk, cache[:, :kv_lora])
        s = (nope_scores + torch.einsum("shr,tr->sht", q_rope[b], cache[:, kv_lora:])) * scale
        s = s.masked_fill(t > (n - S + torch.arange(S))[:, None, None], -math.inf)
        out.append(torch.einsum("sht,htv->shv", torch.softmax(s, -1), values) if decompressed else
                   torch.einsum("sht,tc,hcv->shv", torch.softmax(s, -1), cache[:, :kv_lora], w_uv))
    return torch.stack(out)


def _decode_by_head(q_nope, q_rope, kv_cache, block_table, seq_lens, w_uk, w_uv, scale):
    """Right too: one sequence and one head at a time, matmuls, the query absorbed by broadcasting."""
    S, page, kv_lora = q_nope.shape[1], kv_cache.shape[1], w_uk.shape[2]
    out = torch.zeros(q_nope.shape[:3] + (w_uv.shape[2],), dtype=torch.float64)
    for b in range(q_nope.shape[0]):
        n = int(seq_lens[b])
        rows = torch.cat([kv_cache[int(block_table[b, j])] for j in range(-(-n // page))])[:n]
        hide = torch.arange(n)[None, :] > (n - S + torch.arange(S))[:, None]
        for h in range(q_nope.shape[2]):
            q_lat = (q_nope[b, :, h, :, None] * w_uk[h]).sum(-2)                   # (S, kv_lora)
            s = (q_lat @ rows[:, :kv_lora].T + q_rope[b, :, h] @ rows[:, kv_lora:].T) * scale
            out[b, :, h] = torch.softmax(s.masked_fill(hide, -math.inf), -1) @ rows[:, :kv_lora] @ w_uv[h]
    return out


def test_paged_decode_right_and_stub():
    assert check_paged_mla_decode(_decode_by_head).passed
    assert check_paged_mla_decode(paged_mla_decode).passed
    assert check_paged_mla_decode(_gathered).passed
    assert check_paged_mla_decode(lambda *a: _gathered(*a, dtype=torch.float32)).passed     # float32 is fine
    assert check_paged_mla_decode(stub).status == "not attempted"


@pytest.mark.parametrize("flags, why", lc.DECODE_MISTAKES, ids=[next(iter(f)) + "=" + str(next(iter(f.values())))
                                                                 for f, _ in lc.DECODE_MISTAKES])
def test_paged_decode_mistakes_named(flags, why):
    assert len(lc.DECODE_MISTAKES) >= 10
    for seed in (2, 3):                    # seed 1 runs in the audit
        with pytest.raises(CheckFailed, match=re.escape(why)):
            check_paged_mla_decode(DecodeAnswer(flags), seed=seed)


def _no_max(q_nope, q_rope, kv_cache, block_table, seq_lens, w_uk, w_uv, scale):
    """Softmax without subtracting the max: right until the scores reach the hundreds."""
    S, page, kv_lora = q_nope.shape[1], kv_cache.shape[1], w_uk.shape[2]
    out = []
    for b in range(q_nope.shape[0]):
        n = int(seq_lens[b])
        t = torch.arange(n)
        cache = kv_cache[block_table[b, t // page].long(), t % page]
        s = (torch.einsum("shd,hdc,tc->sht", q_nope[b], w_uk, cache[:, :kv_lora])
             + torch.einsum("shr,tr->sht", q_rope[b], cache[:, kv_lora:])) * scale
        e = torch.exp(s).masked_fill(t > (n - S + torch.arange(S))[:, None, None], 0.0)
        out.append(torch.einsum("sht,tc,hcv->shv", e / e.sum(-1, keepdim=True), cache[:, :kv_lora], w_uv))
    return torch.stack(out)


@pytest.mark.parametrize("wrong, match", [
    (_no_max, r"NaN or inf -- exp of a raw score overflows"),
    (lambda *a: paged_mla_decode(*a[:6], torch.eye(a[5].shape[2], dtype=a[5].dtype).expand(a[5].shape[0], -1, -1),
                                 a[7]), r"is the latent output: apply W_uv"),          # W_uv left out
    (lambda *a: paged_mla_decode(*a).transpose(1, 2), r"expected \(\d+, 2, 3, 5\) = \(B, S, H, v_dim\)"),
    (lambda *a: paged_mla_decode(*a).tolist(), r"returned list"),
])
def test_paged_decode_other_wrong_answers(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_paged_mla_decode(wrong)


def test_paged_decode_refuses_the_references():
    from common.kernels import mla_decode
    with pytest.raises(CheckFailed, match=r"the reference this exercise asks you to write"):
        check_paged_mla_decode(lambda *a: mla_decode.paged_mla(*a))
    with pytest.raises(CheckFailed, match=r"the reference this exercise asks you to write"):
        check_paged_mla_decode(lambda qn, qr, kv, bt, lens, uk, uv, sc: torch.stack([
            _gathered(qn[b:b + 1], qr[b:b + 1], kv, bt[b:b + 1], lens[b:b + 1], uk, uv, sc)[0]
            for b in range(qn.shape[0])]) + 0 * mla_decode.gather_sequence(kv, bt, 0, 1).sum())


# ---- 14.8
def allocate(state, tokens):
    bs = state.block_size
    blocks, name, hits = [], None, 0
    for i in range((len(tokens) - 1) // bs):                   # full blocks before the last token, in order
        key = hash((name, tuple(tokens[i * bs:(i + 1) * bs])))
        if key not in state.cached:
            break                                              # the first miss ends the shared prefix
        b = state.cached[key]
        if state.refs[b] == 0:
            state.free.remove(b)                               # cached, unused: back in use
        state.refs[b] += 1
        blocks.append(b)
        name, hits = key, hits + bs
    for i in range(len(blocks), -(-len(tokens) // bs)):
        chunk = tuple(tokens[i * bs:(i + 1) * bs])
        b = state.free.pop(0)                                  # the least recently used block
        if b in state.block_name:                              # evict what it held
            del state.cached[state.block_name.pop(b)]
        state.refs[b] = 1
        blocks.append(b)
        name = hash((name, chunk))
        if len(chunk) == bs and name not in state.cached:      # only full blocks get a name
            state.cached[name], state.block_name[b] = b, name
    return state, blocks, hits


def release(state, blocks):
    for b in reversed(blocks):                                 # the tail first: evicted before the prefix
        state.refs[b] -= 1
        if state.refs[b] == 0:
            state.free.append(b)                               # keeps its name until evicted
    return state


def _prefix_as_learner(cls):
    own = type("Learner" + cls.__name__, (cls,), {"allocate": own_copy(cls.allocate),
                                                  "release": own_copy(cls.release)})()
    return own.allocate, own.release


def test_prefix_cache_right_and_stub():
    assert check_prefix_cache(allocate, release).passed
    assert check_prefix_cache(*_prefix_as_learner(lc.PrefixCachePolicy)).passed
    assert check_prefix_cache(stub, stub).status == "not attempted"
    assert check_prefix_cache(allocate, stub).status == "not attempted"


@pytest.mark.parametrize("cls, why", lc.PREFIX_MISTAKES, ids=[c.__name__ for c, _ in lc.PREFIX_MISTAKES])
def test_prefix_cache_wrong_policies_named(cls, why):
    assert len(lc.PREFIX_MISTAKES) >= 10
    for seed in (2, 3):                    # seed 1 runs in the audit
        with pytest.raises(CheckFailed, match=re.escape(why)):
            check_prefix_cache(*_prefix_as_learner(cls), seed=seed)


def test_prefix_cache_other_wrong_answers():
    from common.systems.inference import prefix_cache
    with pytest.raises(CheckFailed, match=r"expected \(state, blocks, hit_tokens\)"):
        check_prefix_cache(lambda st, t: allocate(st, t)[1:], release)
    with pytest.raises(CheckFailed, match=r"return the CacheState you were given"):
        check_prefix_cache(allocate, lambda st, b: None)
    with pytest.raises(CheckFailed, match=r"the reference this exercise asks you to write"):
        check_prefix_cache(lambda st, t: prefix_cache.allocate(st, t), release)


def test_prefix_state_is_written_back_over_the_wire():
    """The grader gives the learner's function a copy of the state: what it changed comes back into the original
    (a mutable dataclass of `common`, field by field), also when the function returns the state it was given."""
    from common.core.grading.remote import write_back
    from common.systems.inference import prefix_cache
    orig = prefix_cache.new_state(4, 2)
    copy_ = prefix_cache.new_state(4, 2)
    allocate(copy_, [1, 2, 3, 4, 5])
    write_back(orig, copy_)
    assert orig == copy_ and orig.free == [3] and orig.refs[2] == 1 and len(orig.cached) == 2


# ---- warm-ups: 14.9, 14.10 (scheduler), 14.11 (decode loop), 14.12, 14.13 (prefix cache)
from common.exercises.lab14 import (check_block_names, check_blocks_to_grow, check_can_admit,  # noqa: E402
                                    check_hit_tokens, check_new_token_mask)
from common.exercises.lab14_cases import warmup_cases as wc  # noqa: E402


def blocks_to_grow(tokens, block_size):
    return -(-(tokens + 1) // block_size) - -(-tokens // block_size)


def can_admit(tokens, running, free_blocks, block_size, max_batch):
    return running < max_batch and -(-(tokens + 1) // block_size) <= free_blocks


def new_token_mask(seq_len, s_q, positions):
    pos = seq_len - s_q + torch.arange(s_q)
    return positions[None, :] <= pos[:, None]


def block_names(tokens, block_size):
    names, parent = [], None
    for i in range(len(tokens) // block_size):
        parent = hash((parent, tuple(tokens[i * block_size:(i + 1) * block_size])))
        names.append(parent)
    return names


def hit_tokens(names, cached, n_tokens, block_size):
    n = 0
    while n < (n_tokens - 1) // block_size and names[n] in cached:
        n += 1
    return n * block_size


def test_warmups_right_and_stub():
    for check, right in ((check_blocks_to_grow, blocks_to_grow), (check_can_admit, can_admit),
                         (check_new_token_mask, new_token_mask), (check_block_names, block_names),
                         (check_hit_tokens, hit_tokens)):
        assert check(right).passed, check.__name__
        assert check(stub).status == "not attempted", check.__name__
    assert check_blocks_to_grow(lambda t, bs: int(t % bs == 0)).passed       # the same rule, written another way
    assert check_can_admit(lambda t, r, f, bs, mb: bool(r < mb) & bool((t + bs) // bs <= f)).passed
    assert check_new_token_mask(lambda n, s, p: (p[None, :] <= (n - s + torch.arange(s))[:, None]).int()).passed


@pytest.mark.parametrize("wrong, why", wc.GROW_MISTAKES, ids=[f"grow{i}" for i in range(len(wc.GROW_MISTAKES))])
def test_blocks_to_grow_mistakes_named(wrong, why):
    with pytest.raises(CheckFailed, match=re.escape(why)):
        check_blocks_to_grow(wrong)


@pytest.mark.parametrize("wrong, why", wc.ADMIT_MISTAKES, ids=[f"admit{i}" for i in range(len(wc.ADMIT_MISTAKES))])
def test_can_admit_mistakes_named(wrong, why):
    for seed in (1, 2):
        with pytest.raises(CheckFailed, match=re.escape(why)):
            check_can_admit(wrong, seed=seed)


def _as_mask(fn):
    return lambda n, s, p: torch.tensor(fn(n, s, p), dtype=torch.bool).reshape(s, len(p))


@pytest.mark.parametrize("wrong, why", wc.MASK_MISTAKES, ids=[f"mask{i}" for i in range(len(wc.MASK_MISTAKES))])
def test_new_token_mask_mistakes_named(wrong, why):
    with pytest.raises(CheckFailed, match=re.escape(why)):
        check_new_token_mask(_as_mask(wrong))


def test_new_token_mask_other_wrong_answers():
    with pytest.raises(CheckFailed, match=r"is \(positions, s_q\)"):
        check_new_token_mask(lambda n, s, p: new_token_mask(n, s, p).T)
    with pytest.raises(CheckFailed, match=r"expected a bool tensor"):
        check_new_token_mask(lambda n, s, p: new_token_mask(n, s, p).tolist())


@pytest.mark.parametrize("wrong, match", [
    (lambda t, bs: [hash(tuple(t[i * bs:(i + 1) * bs])) for i in range(len(t) // bs)], r"by its own tokens only"),
    (lambda t, bs: block_names(t + [0] * (-len(t) % bs), bs) if len(t) % bs else block_names(t, bs),
     r"named the partial last block"),
    (lambda t, bs: block_names(t[:-1], bs), r"name every full block"),
    (lambda t, bs: [hash(tuple(t[:(i + 1) * bs])) for i in range(len(t) // bs)], r"hashes the whole prefix"),
    (lambda t, bs: [n for n in _swapped(t, bs)], r"the parent's name comes first"),
    (lambda t, bs: block_names(t, bs)[:1] + [hash((0, tuple(t[i * bs:(i + 1) * bs]))) for i in range(1, len(t) // bs)],
     r"is not hash\(\(names\[0\]"),
    (lambda t, bs: [hash(len(t))] * (len(t) // bs), r"first block's name changed|not hash"),
    (lambda t, bs: "names", r"expected a list of names"),
])
def test_block_names_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_block_names(wrong)


def _swapped(tokens, bs):
    names, parent = [], None
    for i in range(len(tokens) // bs):
        parent = hash((tuple(tokens[i * bs:(i + 1) * bs]), parent))
        names.append(parent)
    return names


def test_block_names_must_not_change_the_tokens():
    def pops(t, bs):
        out = block_names(t, bs)
        t.clear()
        return out
    with pytest.raises(CheckFailed, match=r"changed the token list"):
        check_block_names(pops)


@pytest.mark.parametrize("wrong, why", wc.HIT_MISTAKES, ids=[f"hit{i}" for i in range(len(wc.HIT_MISTAKES))])
def test_hit_tokens_mistakes_named(wrong, why):
    with pytest.raises(CheckFailed, match=re.escape(why)):
        check_hit_tokens(wrong)


def test_the_grader_sees_the_same_routes(monkeypatch):
    """Through the grader's wire (a loopback): the library watch, the checker's own code and what an exercise hands
    over (scheduler.Seq) hold as in a kernel."""
    from common.core import checks
    from common.exercises import remote
    from common.exercises.lab14_cases import mla_cases
    from common.kernels import mla
    monkeypatch.setattr(checks, "submission_hook", remote.loopback_hook)

    def via_helpers(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale):
        q, kv = mla.mqa_inputs(q_nope, q_rope, latent, k_rope, w_uk)
        return torch.einsum("qhc,hcv->qhv", mla.mqa_attention(q, kv, latent.shape[1], scale)[0], w_uv)
    with pytest.raises(CheckFailed, match=r"called common\.kernels\.mla\.mqa_(inputs|attention), the workbook's own"):
        check_absorbed_attention(via_helpers)
    with pytest.raises(CheckFailed, match=r"mla_cases\.intensity_reference, the checker's own code"):
        check_decode_intensity(lambda *a: mla_cases.intensity_reference(*a))
    assert check_decode_intensity(right_intensity).passed
    assert check_schedule_step(schedule_step).passed

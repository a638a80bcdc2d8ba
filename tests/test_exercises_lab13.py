"""Lab 13 checkers: right answers pass, each classic mistake fails with a telling message, stubs are not attempted."""
import pytest

from common.core.checks import CheckFailed
from common.exercises import layer_model
from common.exercises.lab13 import check_exposed_all_to_all, check_gpu_hours, check_layer_seconds, check_moe_layer_flops


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise: replace this line with your code")


# ---- 13.1
def mla(cfg, swap=None):
    h, nh, qr, kvr = cfg["hidden_size"], cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    dims = {"nope": cfg["qk_nope_head_dim"], "rope": cfg["qk_rope_head_dim"], "v": cfg["v_head_dim"]}
    if swap:
        a, b = swap
        dims[a], dims[b] = dims[b], dims[a]
    nope, rope, vd = dims["nope"], dims["rope"], dims["v"]
    return h * qr + qr * nh * (nope + rope) + h * (kvr + rope) + kvr * nh * (nope + vd) + nh * vd * h


def right_flops(cfg, tokens, factor=2, experts=None, shared=True, router=True, attn=True, mats=3, swap=None):
    h, i = cfg["hidden_size"], cfg["moe_intermediate_size"]
    k = cfg["num_experts_per_tok"] if experts is None else experts
    n = (k + (cfg["n_shared_experts"] if shared else 0)) * mats * h * i
    n += (cfg["n_routed_experts"] * h if router else 0) + (mla(cfg, swap) if attn else 0)
    return factor * tokens * n


def test_moe_layer_flops_right_and_stub():
    assert check_moe_layer_flops(right_flops).passed
    assert check_moe_layer_flops(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda c, t: right_flops(c, t, factor=1), r"one FLOP per multiply-add"),
    (lambda c, t: right_flops(c, t, factor=6), r"forward \+ backward"),
    (lambda c, t: right_flops(c, t, shared=False), r"shared expert"),
    (lambda c, t: right_flops(c, t, router=False), r"router"),
    (lambda c, t: right_flops(c, t, attn=False), r"MLA projections"),
    (lambda c, t: right_flops(c, t, experts=c["n_routed_experts"]), r"every routed expert"),
    (lambda c, t: right_flops(c, t, mats=2), r"3 \(gate, up and down\)"),
    (lambda c, t: right_flops(c, t, swap=("nope", "rope")), r"swaps qk_nope_head_dim and qk_rope_head_dim"),
    (lambda c, t: right_flops(c, t, swap=("nope", "v")), r"swaps qk_nope_head_dim and v_head_dim"),
    (lambda c, t: right_flops(c, t, swap=("rope", "v")), r"swaps qk_rope_head_dim and v_head_dim"),
    (lambda c, t: right_flops(v3_cfg(), t), r"moe_layer_flops\(cfg with hidden=4096"),  # ignores cfg
    (lambda c, t: None, r"returned None"),
    (lambda c, t: (1.0, 2.0), r"returned tuple"),
])
def test_moe_layer_flops_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_moe_layer_flops(wrong)


def test_head_dims_are_distinct_in_a_fixed_case():
    # V3 itself has qk_nope = v_head = 128: a checker that only used V3 could not see that swap
    from common.exercises.lab13 import _configs
    import random
    fixed, rand = _configs(random.Random(0))
    for cfg in fixed[1:] + rand:
        assert len({cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]}) == 3


def v3_cfg():
    from common.systems.v3 import model as v3model
    return v3model.config()


# ---- 13.3
def right_exposed(F, B, cf, cb, ov):
    return max(0.0, cf + cb - F - B) if ov else cf + cb


def test_exposed_right_and_stub():
    assert check_exposed_all_to_all(right_exposed).passed
    assert check_exposed_all_to_all(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda F, B, cf, cb, ov: cf + cb - F - B if ov else cf + cb, r"negative"),
    (lambda F, B, cf, cb, ov: cf + cb, r"no overlap counted"),
    (lambda F, B, cf, cb, ov: max(cf + cb, F + B) if ov else cf + cb, r"the pair's time"),
    (lambda F, B, cf, cb, ov: max(0, cf - F) + max(0, cb - B) if ov else cf + cb, r"its own compute"),
    (lambda F, B, cf, cb, ov: max(0.0, cf + cb - F - B), r"nothing to overlap"),
    (lambda F, B, cf, cb, ov: max(0.0, cf + cb - F - B) if ov else cf, r"both passes"),
    (lambda F, B, cf, cb, ov: "0.1", r"returned str"),
])
def test_exposed_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_exposed_all_to_all(wrong)


# ---- 13.4
def right_hours(step, gpus, tokens):
    return step * gpus / 3600 * 1e12 / tokens


def test_gpu_hours_right_and_stub():
    assert check_gpu_hours(right_hours).passed
    assert check_gpu_hours(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda s, g, t: s * g * 1e12 / t, r"GPU-seconds"),
    (lambda s, g, t: s / 3600 * 1e12 / t, r"wall-clock hours"),
    (lambda s, g, t: s * g / 3600 / t, r"per token"),
    (lambda s, g, t: s * g / 86400 * 1e12 / t, r"GPU-days"),
    (lambda s, g, t: s * 2048 / 3600 * 1e12 / t, r"gpu_hours_per_t_tokens\(3, 1024"),   # ignores gpus
    (lambda s, g, t: s * g / 3600 * 1e12 / (15360 * 4096), r"gpu_hours_per_t_tokens\(3, 1024"),  # ignores tokens
])
def test_gpu_hours_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_gpu_hours(wrong)


def test_calling_the_reference_is_caught():
    from common.systems.v3 import model as v3model
    with pytest.raises(CheckFailed, match=r"the reference this exercise asks you to write"):
        check_gpu_hours(lambda s, g, t: v3model.gpu_hours_per_t_tokens(s, g, t))
    with pytest.raises(CheckFailed, match=r"the reference this exercise asks you to write"):
        check_exposed_all_to_all(lambda F, B, cf, cb, ov: v3model.exposed(cf + cb, F + B) if ov else cf + cb)
    assert v3model.gpu_hours_per_t_tokens.__name__ == "gpu_hours_per_t_tokens"


# ---- 13.2 (the build exercise)
def right_layer(cfg, tokens, kit):
    """A learner's answer, written apart from the checker's reference: every linear layer three ways, the recompute,
    the BF16 router, causal attention, the memory-bound bytes."""
    h, nh, E, top = cfg["hidden_size"], cfg["num_attention_heads"], cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    qr, kvr, rope = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    dq, dkv, vd = cfg["qk_nope_head_dim"] + rope, cfg["qk_nope_head_dim"] + cfg["v_head_dim"], cfg["v_head_dim"]
    f, s, T, g = cfg["moe_intermediate_size"], cfg["n_shared_experts"], tokens, E // kit.ep

    def t(m, n, k, kind, groups=1):
        return 2 * m * n * k * groups / (kit.gemm_tflops(m, n, k, kind, groups) * kit.sm_share * 1e12)
    fwd = bwd = 0.0
    for m, n, k, gr in [(T, qr, h, 1), (T, kvr + rope, h, 1), (T, nh * dq, qr, 1), (T, nh * dkv, kvr, 1),
                        (T, h, nh * vd, 1), (T, 2 * f * s, h, 1), (T, h, f * s, 1), (T * top / g, 2 * f, h, g),
                        (T * top / g, h, f, g)]:
        fwd, bwd = fwd + t(m, n, k, "fwd", gr), bwd + t(m, n, k, "dgrad", gr) + t(m, n, k, "wgrad", gr)
    bwd += t(T, nh * dq, qr, "fwd") + t(T, nh * dkv, kvr, "fwd")
    for kind in ("fwd", "dgrad", "wgrad"):
        sec = 2 * T * E * h / (kit.bf16_efficiency(T, E, h, kind) * kit.peak_tflops("bf16") * kit.sm_share * 1e12)
        fwd, bwd = (fwd + sec, bwd) if kind == "fwd" else (fwd, bwd + sec)
    att = T * kit.seq * nh * (dq + vd)
    fwd += att / (kit.attention_tflops("forward") * kit.sm_share * 1e12) + kit.memory_bytes["forward"] / (
        kit.hbm_tbs * 1e12)
    bwd += 2.5 * att / (kit.attention_tflops("backward") * kit.sm_share * 1e12) + kit.memory_bytes["backward"] / (
        kit.hbm_tbs * 1e12)
    return {"forward": fwd, "backward": bwd}


def test_layer_seconds_right_stub_and_reference():
    import random

    from common.systems.v3 import kit as v3kit
    assert check_layer_seconds(right_layer).passed
    assert check_layer_seconds(layer_model.reference).passed
    assert check_layer_seconds(stub).status == "not attempted"
    for cfg, setup, _ in layer_model.cases(v3_cfg(), random.Random(3)):  # the checker's reference is the lab's model
        want, got = v3kit.layer_seconds(cfg, setup), layer_model.reference(cfg, setup.tokens, v3kit.Kit(cfg, setup))
        assert got == pytest.approx(want, rel=1e-12)
    with pytest.raises(CheckFailed, match=r"the reference this exercise asks you to write"):
        check_layer_seconds(lambda cfg, tokens, kit: v3kit.layer_seconds(cfg, kit.setup))


@pytest.mark.parametrize("mistake", sorted(layer_model.MISTAKES))
def test_layer_seconds_names_the_mistake(mistake):
    import functools
    import re
    with pytest.raises(CheckFailed, match=re.escape(layer_model.MISTAKES[mistake][:40])):
        check_layer_seconds(functools.partial(layer_model.reference, **{mistake: True}))


def test_layer_seconds_other_wrong_answers():
    for wrong, match in [(lambda c, t, k: dict.fromkeys(("forward", "backward"), right_layer(c, t, k)["forward"]),
                          "backward = forward"),
                         (lambda c, t, k: right_layer(c, t, k)["forward"], "return a dict"),
                         (lambda c, t, k: {d: 1e3 * v for d, v in right_layer(c, t, k).items()}, "seconds")]:
        with pytest.raises(CheckFailed, match=match):
            check_layer_seconds(wrong)


def test_right_answers_written_differently_pass():
    """Right answers in other shapes: no library call refused, no look-alike named."""
    def flops_by_part(cfg, tokens):
        h = cfg["hidden_size"]
        nh, nope, rope, vd = (cfg[k] for k in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim",
                                               "v_head_dim"))
        shapes = [(h, cfg["q_lora_rank"]), (cfg["q_lora_rank"], nh * (nope + rope)), (h, cfg["kv_lora_rank"] + rope),
                  (cfg["kv_lora_rank"], nh * (nope + vd)), (nh * vd, h), (h, cfg["n_routed_experts"])]
        shapes += [(h, cfg["moe_intermediate_size"])] * (3 * (cfg["num_experts_per_tok"] + cfg["n_shared_experts"]))
        return sum(2 * tokens * a * b for a, b in shapes)
    assert check_moe_layer_flops(flops_by_part).passed
    assert check_exposed_all_to_all(lambda F, B, cf, cb, ov: (cf + cb - (F + B) if cf + cb > F + B else 0.0) if ov
                                    else cb + cf).passed

"""Lab 13's named wrong answers: the MoE layer's FLOPs (13.1), its forward and backward seconds from the published
rates (13.2, the build exercise) and the exposed all-to-all of a chunk (13.3) -- look-alike formulas, units and the
cheats that call the workbook's own model."""
import functools

from test_exercises_lab13 import right_exposed, right_flops, right_layer, v3_cfg

from common.exercises import lab13, layer_model
from common.systems.v3 import kit as v3kit
from common.systems.v3 import model as v3model


def _mistake(name):
    return functools.partial(layer_model.reference, **{name: True})


def _from_the_kernel_list(cfg, tokens, kit):
    """The lab's kernel list summed by phase: the workbook's model does the exercise."""
    from common.systems.v3 import kernels
    ks = [k for k in kernels.moe_layer(cfg, kit.setup) if not k.cls.startswith("deepep")]
    return {"forward": sum(k.seconds for k in ks if k.phase in v3kit.FORWARD),
            "backward": sum(k.seconds for k in ks if k.phase in v3kit.BACKWARD)}


WRONG = {
    lab13.check_moe_layer_flops: [
        (lambda c, t: right_flops(c, t, factor=1), "one FLOP per multiply-add"),
        (lambda c, t: right_flops(c, t, factor=6), "forward \\+ backward"),
        (lambda c, t: right_flops(c, t, shared=False), "leaves out the shared expert"),
        (lambda c, t: right_flops(c, t, router=False), "leaves out the router"),
        (lambda c, t: right_flops(c, t, attn=False), "leaves out the MLA projections"),
        (lambda c, t: right_flops(c, t, experts=c["n_routed_experts"]), "every routed expert on every token"),
        (lambda c, t: right_flops(c, t, mats=2), "3 \\(gate, up and down\\)"),
        (lambda c, t: right_flops(c, t, swap=("nope", "rope")), "swaps qk_nope_head_dim and qk_rope_head_dim"),
        (lambda c, t: right_flops(c, t, swap=("nope", "v")), "swaps qk_nope_head_dim and v_head_dim"),
        (lambda c, t: right_flops(c, t, swap=("rope", "v")), "swaps qk_rope_head_dim and v_head_dim"),
        (lambda c, t: right_flops(v3_cfg(), t), "moe_layer_flops\\(cfg with hidden=4096"),
        (lambda c, t: t * sum(f for _, _, f in v3model.forward_flops_per_token(c)) / c["num_hidden_layers"],
         "forward_flops_per_token, the reference"),
    ],
    lab13.check_layer_seconds: [(_mistake(m), layer_model.MISTAKES[m][:40].replace("(", "\\(").replace("+", "\\+"))
                                for m in ("all_sms", "comm_sms", "one_flop_per_mac", "no_recompute", "no_wgrad",
                                          "attention_bwd_flops", "not_causal", "attention_bwd_rate", "rows_per_group",
                                          "no_shared", "no_router", "no_memory", "hbm_in_gb", "split_gate_up")] + [
        (lambda c, t, k: right_layer(c, t, k)["forward"], "return a dict"),
        (lambda c, t, k: {d: 1e3 * v for d, v in right_layer(c, t, k).items()}, "\\(seconds\\)"),
        (lambda c, t, k: v3kit.layer_seconds(c, k.setup), "the reference this exercise asks you to write"),
        (_from_the_kernel_list, "kernels.moe_layer, the workbook's own code"),
    ],
    lab13.check_exposed_all_to_all: [
        (lambda F, B, cf, cb, ov: max(cf + cb, F + B) if ov else cf + cb, "the pair's time"),
        (lambda F, B, cf, cb, ov: max(0, cf - F) + max(0, cb - B) if ov else cf + cb, "its own compute"),
        (lambda F, B, cf, cb, ov: max(0.0, cf + cb - F - B), "nothing to overlap"),
        (lambda F, B, cf, cb, ov: max(0.0, cf + cb - F - B) if ov else cf, "count both passes"),
        (lambda F, B, cf, cb, ov: max(0.0, max(cf, cb) - F - B) if ov else cf + cb, "the larger of the two"),
        (lambda F, B, cf, cb, ov: 1e3 * right_exposed(F, B, cf, cb, ov), "milliseconds"),
        (lambda F, B, cf, cb, ov: str(right_exposed(F, B, cf, cb, ov)), "returned str"),
        (lambda F, B, cf, cb, ov: v3model.exposed(cf + cb, F + B) if ov else cf + cb,
         "exposed, the reference this exercise"),
    ],
}

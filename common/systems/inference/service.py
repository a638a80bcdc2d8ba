"""The service's bill from its throughput: cost per million tokens, the daily cost and the margin at R1's prices,
the KV cache a prefill node hands to a decode node, what the on-disk KV cache saves, which input of the
first-principles model (`common.systems.inference.model`) would have to move to reproduce a reported figure, and
the gap between the model and the reported figures sized term by term.

Day accounting (DeepSeek's day-6 figures, data/deepseek_v3_service.json): a day's input tokens at the prefill rate
per node and its output tokens at the decode rate per node give the nodes the service holds on average -- divided by
the utilisation, the share of the time a node works at that rate (1: every node busy all day, which makes the margin
a ceiling); at $/GPU-hour x 8 GPUs x 24 h, the daily cost; at R1's prices (cache hits, misses, output), the daily
revenue.

The gap (`decode_gap`, `prefill_gap`): each is a product of named terms whose product is the whole ratio, so
nothing is left unsized -- decode: the batch the model runs against the batch the reported figures imply, times
the step at that batch against the reported step; prefill on computed tokens (the cache hits cost no prefill):
the model as stated, times the cached prefix's kv_b up-projection, times its load from 3FS.
"""
from __future__ import annotations

import math
from dataclasses import replace


from common.core.validate import number, whole
from common.systems.inference import model as im

SECONDS_PER_HOUR = 3600


def cost_per_m_tokens(tokens_per_s_per_node: float, usd_per_gpu_hour: float, gpus_per_node: int = 8) -> float:
    """US dollars per million tokens of a node producing `tokens_per_s_per_node`: the node's hourly price over the
    tokens it makes in an hour."""
    number("tokens_per_s_per_node", tokens_per_s_per_node), number("usd_per_gpu_hour", usd_per_gpu_hour)
    whole("gpus_per_node", gpus_per_node)
    return usd_per_gpu_hour * gpus_per_node / (tokens_per_s_per_node * SECONDS_PER_HOUR) * 1e6


def revenue_per_day(input_tokens: float, hit_rate: float, output_tokens: float) -> float:
    """A day's tokens at DeepSeek-R1's prices (input: cache hit / miss; output)."""
    f = im.fact
    return (input_tokens * hit_rate * f("price_input_hit_per_m") + input_tokens * (1 - hit_rate) *
            f("price_input_miss_per_m") + output_tokens * f("price_output_per_m")) / 1e6


def day(decode_per_node: float, prefill_per_node: float, usd_per_gpu_hour: float | None = None,
        hit_rate: float | None = None, utilisation=1.0) -> dict:
    """The reported day's tokens served at the given throughputs per node: nodes, cost, revenue, margin, and the
    cost per million output tokens (decode nodes only, and all-in: the whole bill over the output tokens).
    `utilisation`: the share of the day a node works at its throughput, one number or (decode, prefill); the nodes
    are divided by it. At 1 (every node busy all day) the cost is the least and the margin a ceiling (`margin_kind`
    says which); every value is a number, so a table of days stays numeric."""
    f = im.fact
    usd = f("usd_per_gpu_hour") if usd_per_gpu_hour is None else usd_per_gpu_hour
    hit = f("cache_hit_rate") if hit_rate is None else hit_rate
    u_dec, u_pre = (utilisation, utilisation) if isinstance(utilisation, (int, float)) else utilisation
    for name, u in (("decode utilisation", u_dec), ("prefill utilisation", u_pre)):
        if not 0 < number(name, u) <= 1:
            raise ValueError(f"{name}={u!r} is not allowed; allowed: 0 < utilisation <= 1")
    gpn = f("gpus_per_node")
    inp, out = f("input_tokens_per_day"), f("output_tokens_per_day")
    nodes_decode = out / im.SECONDS_PER_DAY / decode_per_node / u_dec
    nodes_prefill = inp / im.SECONDS_PER_DAY / prefill_per_node / u_pre
    cost = (nodes_decode + nodes_prefill) * gpn * 24 * usd
    revenue = revenue_per_day(inp, hit, out)
    return {"nodes_decode": nodes_decode, "nodes_prefill": nodes_prefill, "nodes": nodes_decode + nodes_prefill,
            "cost_per_day": cost, "revenue_per_day": revenue, "margin": revenue / cost - 1,
            "usd_per_m_output_decode": cost_per_m_tokens(decode_per_node * u_dec, usd, gpn),
            "usd_per_m_output_all_in": cost / out * 1e6, "utilisation_decode": u_dec, "utilisation_prefill": u_pre}


def margin_kind(d: dict) -> str:
    """What a `day` result's margin is: a ceiling when every node is busy all day, else the utilisation it assumes."""
    u_dec, u_pre = d["utilisation_decode"], d["utilisation_prefill"]
    return "ceiling: every node busy all day (100% utilisation)" if u_dec == u_pre == 1 else \
        f"at {u_dec:.0%} (decode) and {u_pre:.0%} (prefill) utilisation"


def reported_day() -> dict:
    """`day` at the reported per-node throughputs: it reproduces the reported nodes, cost and margin."""
    return day(im.fact("decode_tokens_per_s_per_node"), im.fact("prefill_tokens_per_s_per_node"))


def kv_transfer(context: int, bytes_per_token: float, link_gbs: float) -> dict:
    """The KV cache of one request's prompt sent from its prefill node to its decode node (NIXL's job)."""
    nbytes = context * bytes_per_token
    return {"bytes": nbytes, "seconds": nbytes / (link_gbs * 1e9)}


def solve_for(phase: str, name: str, lo: float, hi: float, target: float | None = None, **changes) -> float:
    """The value of input `name` in [lo, hi] at which `inference_model.predict` gives `target` tokens/s per node
    (default: the reported figure of the phase), every other input as stated (or as in `changes`); NaN when no
    value in the range reaches it. The prediction must be monotone in `name`."""
    base = (im.decode_inputs if phase == "decode" else im.prefill_inputs)(**changes)
    goal = target or im.fact("decode_tokens_per_s_per_node" if phase == "decode" else
                             "prefill_tokens_per_s_per_node")
    ints = isinstance(getattr(base, name), int) and not isinstance(getattr(base, name), bool)

    def gap(v):
        v = int(round(v)) if ints else v
        if ints and phase == "decode":
            v = max(base.micro_batches, v - v % base.micro_batches)
        return im.predict(replace(base, **{name: v})).tokens_per_s_per_node / goal - 1
    g_lo, g_hi = gap(lo), gap(hi)
    if g_lo * g_hi > 0:
        return float("nan")
    from scipy.optimize import brentq  # here: scipy.optimize takes 0.5 s to import, and few callers need it
    return brentq(gap, lo, hi, xtol=1e-6 * max(1.0, abs(hi)))


def tornado(phase: str, ranges: dict) -> list:
    """[(input, low, high, tokens/s per node at low, at high)], each input moved alone."""
    base = im.decode_inputs() if phase == "decode" else im.prefill_inputs()
    rows = []
    for name, (lo, hi) in ranges.items():
        rows.append((name, lo, hi, im.predict(replace(base, **{name: lo})).tokens_per_s_per_node,
                     im.predict(replace(base, **{name: hi})).tokens_per_s_per_node))
    return rows


def finite(v: float) -> bool:
    return not math.isnan(v)


# ---------------------------------------------------------------- the gap, term by term

def reported_per_user() -> float:
    """The middle of the reported 20-22 output tokens/s per user: 21."""
    return (im.fact("output_tokens_per_s_per_user_low") + im.fact("output_tokens_per_s_per_user_high")) / 2


def implied_batch(per_user: float | None = None) -> float:
    """Requests per GPU the reported figures imply: tokens/s per node / GPUs per node / tokens/s per user (default:
    `reported_per_user`, 21) = 14,800 / 8 / 21 = 88.1."""
    per_user = per_user or reported_per_user()
    return im.fact("decode_tokens_per_s_per_node") / im.fact("gpus_per_node") / number("per_user", per_user)


def decode_gap(per_user: float | None = None, **changes) -> dict:
    """The decode gap as a product: decode_gap_batch x decode_gap_step = decode_vs_reported.

    The reported point: b* = implied_batch(per_user) requests per GPU, a step of 1 / per_user seconds. The model
    runs b = its batch (128, the profile's; or `changes`) and is also run at b* rounded to its micro-batches (88):
    decode_gap_batch = model(b) / model(88), what the operating point alone explains; decode_gap_step =
    model(88) / reported, the step at that batch -- (88 / b*) x reported step / model step."""
    per_user = per_user or reported_per_user()
    base = im.decode_inputs(**changes)
    b_star = implied_batch(per_user)
    b_ref = max(base.micro_batches, int(round(b_star / base.micro_batches)) * base.micro_batches)
    at_model = im.predict(base)
    at_ref = im.predict(replace(base, tokens_per_gpu=b_ref))
    reported = im.fact("decode_tokens_per_s_per_node")
    gap_batch = at_model.tokens_per_s_per_node / at_ref.tokens_per_s_per_node
    gap_step = at_ref.tokens_per_s_per_node / reported
    return {"batch_model": base.tokens_per_gpu, "batch_reported": b_star, "batch_compared": b_ref,
            "step_model_ms": at_model.step_s * 1e3, "step_model_at_reported_batch_ms": at_ref.step_s * 1e3,
            "step_reported_ms": 1e3 / per_user, "decode_gap_batch": gap_batch, "decode_gap_step": gap_step,
            "decode_vs_reported": at_model.tokens_per_s_per_node / reported, "product": gap_batch * gap_step}


def decode_mtp(acceptance: float | None = None, draft_tokens: int = 1, **changes) -> dict:
    """The MTP scenario (`inference.model`'s draft_tokens / acceptance; default acceptance: 0.85, the low end of the
    V3 report's 85-90%) beside the same decode without MTP: tokens/s per node and per user, the step, and the V3
    report's 1.8x tokens/s (measured at a batch it does not state)."""
    a = im.fact("mtp_acceptance_low") if acceptance is None else acceptance
    plain = im.predict(im.decode_inputs(**changes))
    mtp = im.predict(im.decode_inputs(draft_tokens=draft_tokens, acceptance=a, **changes))
    return {"acceptance": a, "tokens_per_s_per_node": mtp.tokens_per_s_per_node,
            "vs_reported": mtp.vs_reported, "vs_no_mtp": mtp.tokens_per_s_per_node / plain.tokens_per_s_per_node,
            "per_user_tokens_per_s": mtp.per_user_tokens_per_s,
            "per_user_vs_no_mtp": mtp.per_user_tokens_per_s / plain.per_user_tokens_per_s,
            "step_ms": mtp.step_s * 1e3, "step_no_mtp_ms": plain.step_s * 1e3,
            "reported_tps_speedup": im.fact("mtp_tps_speedup"), "memory_gb": mtp.memory_gb["total"]}


def prefill_gap(storage_gibs: float | None = None, storage_overlap: bool = False, **changes) -> dict:
    """Prefill compared on COMPUTED tokens (the cache hits cost no prefill compute), as a product:
    stated x kv_b on the cached prefix x the 3FS load = prefill_computed_vs_reported.

    Reported computed tokens/s per node: 73.7K x (1 - 0.563) = 32.2K. The model as stated computes ~79.8K; charging
    the cached prefix's kv_b up-projection (MHA mode attends over it), then its read from 3FS (default: the 40 GiB/s
    KVCache peak per client node, in series with the step unless storage_overlap) slows it by the two factors."""
    gibs = im.fact("threefs_kvcache_read_gibs") if storage_gibs is None else storage_gibs
    stated = im.prefill_inputs(**changes)
    steps = [im.predict(stated), im.predict(replace(stated, cached_prefix_kv_b=True)),
             im.predict(replace(stated, cached_prefix_kv_b=True, storage_gibs=gibs, storage_overlap=storage_overlap))]
    computed = [p.computed_tokens_per_s_per_node for p in steps]
    reported = im.fact("prefill_tokens_per_s_per_node") * (1 - stated.hit_rate)
    return {"reported_computed_per_node": reported, "model_computed_per_node": computed[-1],
            "stated_vs_reported": computed[0] / reported, "kv_b_cached_prefix": computed[1] / computed[0],
            "threefs_load": computed[2] / computed[1], "prefill_computed_vs_reported": computed[2] / reported,
            "storage_gibs": gibs, "storage_overlap": storage_overlap,
            "threefs_load_s_per_step": steps[2].parts_s.get("3FS load (cached prefix)", 0.0)}


def implied_utilisation() -> dict:
    """The share of the model's capacity the reported throughputs are, per phase (decode at the profile's batch;
    prefill on computed tokens, charges included): what the service would run at if the model's capacity were
    right -- the term the model cannot derive."""
    return {"decode": 1 / im.predict(im.decode_inputs()).vs_reported,
            "prefill": 1 / prefill_gap()["prefill_computed_vs_reported"]}

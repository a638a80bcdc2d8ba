"""The service's bill from its throughput: cost per million tokens, the daily cost and the margin at R1's prices,
the KV cache a prefill node hands to a decode node, what the on-disk KV cache saves, and which input of the
first-principles model (`common.systems.inference.model`) would have to move to reproduce a reported figure.

Day accounting (DeepSeek's day-6 figures, data/deepseek_v3_service.json): a day's input tokens at the prefill rate
per node and its output tokens at the decode rate per node give the nodes the service holds on average; at
$/GPU-hour x 8 GPUs x 24 h, the daily cost; at R1's prices (cache hits, misses, output), the daily revenue.
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
        hit_rate: float | None = None) -> dict:
    """The reported day's tokens served at the given throughputs per node: nodes, cost, revenue, margin, and the
    cost per million output tokens (decode nodes only, and all-in: the whole bill over the output tokens)."""
    f = im.fact
    usd = f("usd_per_gpu_hour") if usd_per_gpu_hour is None else usd_per_gpu_hour
    hit = f("cache_hit_rate") if hit_rate is None else hit_rate
    gpn = f("gpus_per_node")
    inp, out = f("input_tokens_per_day"), f("output_tokens_per_day")
    nodes_decode = out / im.SECONDS_PER_DAY / decode_per_node
    nodes_prefill = inp / im.SECONDS_PER_DAY / prefill_per_node
    cost = (nodes_decode + nodes_prefill) * gpn * 24 * usd
    revenue = revenue_per_day(inp, hit, out)
    return {"nodes_decode": nodes_decode, "nodes_prefill": nodes_prefill, "nodes": nodes_decode + nodes_prefill,
            "cost_per_day": cost, "revenue_per_day": revenue, "margin": revenue / cost - 1,
            "usd_per_m_output_decode": cost_per_m_tokens(decode_per_node, usd, gpn),
            "usd_per_m_output_all_in": cost / out * 1e6}


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

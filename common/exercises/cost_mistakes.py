"""The look-alike answers of lab 07's cost exercises (7.1 all-reduce times, 7.2 bus factors, 7.4 the alpha/beta
fit, 7.5 node-aware send counts), each with the words that name it: a checker names a mistake when its look-alike
gives every value the learner's gives."""
from __future__ import annotations

import math

from common.parallel import collectives as C


def allreduce_seconds(algorithm: str, n, p: int, alpha, bw, rounds=None) -> float:
    """The right formula of `algorithm` (with `rounds` exchange rounds for tree and recursive doubling)."""
    lg = math.ceil(math.log2(p)) if rounds is None else rounds
    if algorithm == "ring":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bw
    return (2 * lg if algorithm == "tree" else lg) * (alpha + n / bw)


def time_mistakes(algorithm: str, n, p: int, alpha, bw) -> dict:
    """{key: (what is wrong, the time it gives)} for the look-alike formulas of `algorithm` (p > 1)."""
    lg, right = math.ceil(math.log2(p)), allreduce_seconds(algorithm, n, p, alpha, bw)
    floor, log2 = (allreduce_seconds(algorithm, n, p, alpha, bw, r) for r in (math.floor(math.log2(p)), math.log2(p)))
    if algorithm == "ring":
        out = {
            "rs": ("you timed a reduce-scatter (or an all-gather) alone; a ring all-reduce is a reduce-scatter "
                   "followed by an all-gather: 2(p-1) steps and 2(p-1)/p * n bytes per rank",
                   (p - 1) * alpha + (p - 1) / p * n / bw),
            "whole": ("each ring step sends one chunk of n/p bytes, not the whole buffer: the bandwidth term is "
                      "2(p-1)/p * n / bandwidth", 2 * (p - 1) * alpha + 2 * n / bw),
            "whole each step": ("each ring step sends one chunk of n/p bytes, not the whole buffer (2(p-1) * (alpha + "
                                "n / bandwidth) sends it every step): the bandwidth term is 2(p-1)/p * n / bandwidth",
                                2 * (p - 1) * (alpha + n / bw)),
            "p steps": ("a ring of p ranks needs p-1 steps per phase, not p (2(p-1) alphas in all)",
                        2 * p * alpha + 2 * (p - 1) / p * n / bw),
            "one phase's latency": ("the latency term counts one phase: the reduce-scatter and the all-gather take "
                                    "p-1 steps each and each step pays alpha: 2(p-1) alphas",
                                    (p - 1) * alpha + 2 * (p - 1) / p * n / bw),
            "one phase's bytes": ("the bandwidth term counts one phase: each rank sends (p-1)/p of the buffer in the "
                                  "reduce-scatter and again in the all-gather, 2(p-1)/p * n / bandwidth",
                                  2 * (p - 1) * alpha + (p - 1) / p * n / bw),
            "no latency": ("the latency term is missing: each of the ring's 2(p-1) steps pays alpha, which decides "
                           "small messages", 2 * (p - 1) / p * n / bw),
        }
    else:
        out = {
            "floor": (f"log2 p rounded down: p={p} ranks need ceil(log2 p) = {lg} rounds (the last, partial round "
                      f"still costs a whole step)", floor),
            "log2": (f"p={p} is not a power of two; the number of exchange rounds is ceil(log2 p) = {lg}, a whole "
                     f"number", log2),
        }
        if algorithm == "tree":
            out["up"] = ("that is only the reduction up the tree; the result must come back down: 2 * ceil(log2 p) * "
                         "(alpha + n / bandwidth)", lg * (alpha + n / bw))
        else:
            out["rd twice"] = ("recursive doubling does not reduce then broadcast: each of its ceil(log2 p) rounds "
                               "exchanges the whole buffer and leaves both partners with the partial sum",
                               2 * lg * (alpha + n / bw))
    out.update({
        "bits": ("you multiplied the bytes by 8: n_bytes is in bytes and the bandwidth in bytes per second",
                 allreduce_seconds(algorithm, 8 * n, p, alpha, bw)),
        "times bw": ("the bandwidth term multiplies by the bandwidth: a message of n bytes takes n / bandwidth seconds",
                     allreduce_seconds(algorithm, n, p, alpha, 1 / bw)),
        "ms": ("that is the time in milliseconds (1000 x seconds): return seconds", 1e3 * right),
        "us": ("that is the time in microseconds (10^6 x seconds): return seconds", 1e6 * right),
    })
    return out


def factor_mistakes(coll: str, p: int) -> dict:
    """{key: (what is wrong, the factor it gives)} for the look-alike factors of `coll`."""
    right = C.bus_factor(coll, p)
    if coll == "broadcast":
        return {}
    out = {"upside": ("upside down -- busbw = algbw * factor, and the factor is the fraction of the buffer each rank "
                      "sends", 1 / right)}
    if coll == "all_reduce":
        out.update({
            "one": ("that is the all-reduce factor at p = 2 only (2(p-1)/p = 1 there)", 1.0),
            "half": ("an all-reduce moves 2(p-1)/p of the buffer per rank (reduce-scatter + all-gather), not (p-1)/p",
                     (p - 1) / p),
            "limit": ("2 is the factor's limit for many ranks; over p ranks each sends 2(p-1)/p of the buffer", 2.0),
        })
    else:
        out.update({
            "double": (f"the factor 2 belongs to the all-reduce only; {coll} moves (p-1)/p of the data per rank",
                       2 * (p - 1) / p),
            "one": (f"a rank's own 1/p of the data never crosses a link: {coll}'s factor is (p-1)/p, not 1", 1.0),
        })
    return out


def fit(sizes, times, p, steps=None, share=None, weight=1.0, ends=False):
    """(alpha, bandwidth) of the ring model t = steps * alpha + share * n / bandwidth, each equation weighted by
    t^-weight (1: relative error, 0: absolute, 2: divided twice); `ends`: solved from the smallest and largest size."""
    import numpy as np
    n, t = np.asarray(sizes, float), np.asarray(times, float)
    steps = 2.0 * (p - 1) if steps is None else steps
    share = C.bus_factor("all_reduce", p) if share is None else share
    if ends:
        n, t = n[[0, -1]], t[[0, -1]]
    w = t ** -weight
    x, *_ = np.linalg.lstsq(np.stack([np.full(len(n), steps), share * n], 1) * w[:, None], t * w, rcond=None)
    return float(x[0]), float(1 / x[1])


def fit_mistakes(sizes, times, p) -> dict:
    """{key: (what is wrong, the (alpha, bandwidth) it gives)} for the look-alike fits."""
    right = fit(sizes, times, p)
    steps, share = 2 * (p - 1), C.bus_factor("all_reduce", p)
    absolute = fit(sizes, times, p, weight=0)
    return {
        "absolute": (f"you fitted absolute times (alpha {absolute[0]:.3g} s, bandwidth {absolute[1]:.3g} B/s; the "
                     f"relative fit gives {right[0]:.3g} s, {right[1]:.3g} B/s): the largest messages then decide "
                     f"everything and alpha is left to their noise. Divide each equation (row of the matrix and its "
                     f"time) by its measured time to fit relative error", absolute),
        "twice": ("you divided each equation by its time twice (weights 1/t^2): divide the row and its time by t "
                  "once, so each residual is a relative error", fit(sizes, times, p, weight=2)),
        "ends": ("you solved from the smallest and the largest size only: least squares over every size averages "
                 "out each size's noise", fit(sizes, times, p, ends=True)),
        "raw": (f"you fitted t = a + b n and returned a and 1/b: the fitted intercept a is the latency of all 2(p-1) "
                f"= {steps} steps (divide by {steps}) and 1/b the algorithm bandwidth (multiply by 2(p-1)/p)",
                fit(sizes, times, p, steps=1, share=1)),
        "intercept": (f"your alpha is the fitted intercept, the latency of all 2(p-1) steps; divide by 2(p-1) = "
                      f"{steps} to get alpha per step", fit(sizes, times, p, steps=1)),
        "p-1": (f"a ring all-reduce takes 2(p-1) = {steps} steps (reduce-scatter, then all-gather), not p-1: your "
                f"alpha is twice alpha per step", fit(sizes, times, p, steps=p - 1)),
        "algbw": (f"your bandwidth is 1/slope, the algorithm bandwidth; each rank sends 2(p-1)/p of the buffer, so the "
                  f"link bandwidth is 2(p-1)/p / slope", fit(sizes, times, p, share=1)),
        "one phase": ("(p-1)/p is one phase's share of the buffer; over a reduce-scatter and an all-gather each rank "
                      "sends 2(p-1)/p of it: your bandwidth is half the link's", fit(sizes, times, p, share=share / 2)),
        "slope": ("you returned the slope (seconds per byte, beta) instead of the bandwidth 1/beta",
                  (right[0], 1 / right[1])),
        "swapped": ("you returned (bandwidth, alpha): the order is (alpha_seconds, bandwidth_bytes_per_s)",
                    (right[1], right[0])),
        "us": ("your alpha is in microseconds (10^6 x seconds): return seconds", (right[0] * 1e6, right[1])),
        "ms": ("your alpha is in milliseconds (1000 x seconds): return seconds", (right[0] * 1e3, right[1])),
        "GB/s": ("your bandwidth is in GB/s (bytes per second / 10^9): return bytes per second",
                 (right[0], right[1] / 1e9)),
    }


def count_mistakes(indices, num_experts, world, g, rank):
    """The send counts of each known mistake, by its own formula."""
    import torch

    from common.parallel import expert_parallel as EP
    epr = num_experts // world
    nodes = indices // (epr * g)
    local = rank % g
    per_pair = [0] * world  # forgotten de-duplication: one copy per (token, expert) to the node's gateway
    for m, c in enumerate(torch.bincount(nodes.reshape(-1), minlength=world // g).tolist()):
        per_pair[m * g + local] = c
    ranks = indices // epr
    hit_r = torch.zeros(indices.shape[0], world, dtype=torch.bool).scatter_(1, ranks, True)
    right = EP.node_send_counts(indices, num_experts, world, g, rank)
    first_rank = [0] * world
    for m in range(world // g):
        first_rank[m * g] = right[m * g + local]
    no_own = list(right)
    no_own[rank] = 0
    by_node, global_rank = [0] * world, [0] * world
    for m in range(world // g):
        by_node[m] = right[m * g + local]
        global_rank[(m * g + rank) % world] += right[m * g + local]
    return {
        "forgotten de-duplication (one copy per (token, expert) instead of one per (token, node))": per_pair,
        "flat split (one copy per expert, to the expert's own rank)": EP.flat_send_counts(indices, num_experts, world),
        "per-rank split (one copy per (token, destination rank), to that rank: de-duplicated by rank, not by node)":
            hit_r.sum(0).tolist(),
        "wrong destination rank (every copy to the node's first rank instead of the rank with your local index)":
            first_rank,
        "own node left out (your own node's copy goes to yourself: counts[rank] is the tokens with an expert on "
        "your node)": no_own,
        "node index used as the rank (counts[node]): the copy for node m goes to rank m * ranks_per_node + "
        "rank % ranks_per_node": by_node,
        "your global rank used as the local index: the copy for node m goes to rank m * ranks_per_node + "
        "rank % ranks_per_node (your index within your node), not m * ranks_per_node + rank": global_rank,
        "off-by-one rank (counts shifted one rank up)": right[-1:] + right[:-1],
        "off-by-one rank (counts shifted one rank down)": right[1:] + right[:1],
    }

"""Lab 06's second build exercise: EPLB's greedy replica placement for one layer -- one replica per expert, each
spare slot to the expert with the largest load per replica, then the replicas packed onto GPUs heaviest first, each
into the lightest GPU that still has a free slot -- checked against the lab's EPLB (`eplb.rebalance_experts`, global
policy, which agrees with DeepSeek's) on the GPUs' max / mean load.

Loads are drawn from a continuous distribution, so the greedy choices have no ties and a right placement puts the
same experts on the same GPUs as the lab's EPLB (the order of slots inside a GPU does not matter). A wrong one is named
by its mistake: what each mistake places is computed here and compared GPU by GPU.
"""
from __future__ import annotations

import torch

from common.core.checks import expect, fail
from common.exercises.cases import learner_call
from common.moe import eplb


def _counts(load, r, rule="per_replica"):
    e = load.numel()
    count = torch.ones(e, dtype=torch.int64)
    for i in range(r - e):
        if rule == "per_replica":
            count[int((load / count).argmax())] += 1
        elif rule == "raw":
            count[int(load.argmax())] += 1
        elif rule == "in_order":
            count[i % e] += 1
    return count


def _pack(items, weight, num_gpus, per_gpu, order="heaviest", target="lightest", capacity=True):
    """Greedy packing of items (expert ids) with their weights; returns the expert ids on each GPU."""
    idx = sorted(range(len(items)), key=lambda i: -weight[i]) if order == "heaviest" else \
        sorted(range(len(items)), key=lambda i: weight[i]) if order == "lightest" else list(range(len(items)))
    gpus, loads = [[] for _ in range(num_gpus)], [0.0] * num_gpus
    for n, i in enumerate(idx):
        room = [g for g in range(num_gpus) if not capacity or len(gpus[g]) < per_gpu]
        if target == "round_robin":
            g = n % num_gpus
        else:
            g = (min if target == "lightest" else max)(room, key=lambda g: (loads[g], g))
        gpus[g].append(items[i])
        loads[g] += weight[i]
    return gpus


def placement(load, r, num_gpus, mistake=None):
    """The expert ids on each GPU, right (mistake None) or with one named mistake."""
    count = _counts(load, r, {"raw_load": "raw", "spares_in_order": "in_order"}.get(mistake, "per_replica"))
    items = [e for e in range(load.numel()) for _ in range(int(count[e]))]
    weight = [float(load[e]) if mistake == "replica_carries_all" else float(load[e] / count[e]) for e in items]
    return _pack(items, weight, num_gpus, r // num_gpus,
                 order={"lightest_first": "lightest", "round_robin": "given"}.get(mistake, "heaviest"),
                 target={"round_robin": "round_robin", "heaviest_gpu": "heaviest"}.get(mistake, "lightest"),
                 capacity=mistake != "no_capacity")


MISTAKES = {
    "spares_in_order": "the spare slots went to the experts in order: each spare goes to the expert whose load per "
                       "replica (load / count) is largest at that moment",
    "raw_load": "the spares went by raw load (load.argmax()), so they all pile onto the heaviest expert: compare the "
                "load per replica, load / count, which falls as an expert gets replicas",
    "replica_carries_all": "each replica was packed with its expert's whole load: a replica carries load / count (the "
                           "expert's tokens are split evenly over its replicas)",
    "lightest_first": "the replicas were packed lightest first: greedy packing takes the heaviest replica first, so "
                      "the big ones are spread before the small ones fill the gaps",
    "round_robin": "the replicas were dealt to the GPUs in turn, in expert order: take them heaviest first, each "
                   "into the lightest GPU that still has a free slot",
    "heaviest_gpu": "each replica went into the heaviest GPU with room: it goes into the *lightest* one",
}


def _chunks(slots, sizes):
    """slots cut into consecutive chunks of `sizes`, each sorted, the chunks sorted (a placement read GPU by GPU)."""
    out, start = [], 0
    for n in sizes:
        out.append(sorted(slots[start:start + n]))
        start += n
    return sorted(out)


def check(place_replicas, cases, references=()) -> str:
    """place_replicas(load [E], num_replicas, num_gpus) -> phy2log [num_replicas]."""
    rng, gen = cases.rng, cases.gen
    # (9, 12, 3): one heavy expert and eight light ones, where the slots per GPU bind (without the limit the light
    # replicas pile onto two GPUs)
    shapes = [(16, 24, 4), (9, 12, 3), (32, 40, 8), (rng.choice([12, 24, 48]), None, rng.choice([2, 4, 6]))]
    for e, r, g in shapes:
        if r is None:
            r = g * (e // g + rng.randint(1, 3))
        load = torch.exp(1.2 * torch.randn(e, generator=gen, dtype=torch.float64)) * 1000
        if (e, r, g) == (9, 12, 3):
            load = (torch.tensor([3000.0] + [20.0] * 8, dtype=torch.float64) * (1 + 0.01 * torch.rand(
                9, generator=gen, dtype=torch.float64)))[torch.randperm(9, generator=gen)]
        what = f"place_replicas(load [{e}], num_replicas={r}, num_gpus={g})"
        got = learner_call(place_replicas, (load.clone(), r, g), what, references, library=True)
        try:
            got = torch.as_tensor(got).to(torch.int64).reshape(-1)
        except (TypeError, ValueError, RuntimeError) as exc:
            fail(f"{what}: return phy2log, the expert each of the {r} slots holds; got {type(got).__name__} ({exc})")
        expect(got.numel() == r, f"{what}: returned {got.numel()} slots; there are num_replicas = {r} physical slots "
                                 f"(every expert once, plus {r - e} spares)")
        expect(bool(((got >= 0) & (got < e)).all()), f"{what}: slot values must be expert ids 0..{e - 1}")
        counts = torch.bincount(got, minlength=e)
        missing = (counts == 0).nonzero().flatten().tolist()
        expect(not missing, f"{what}: expert {missing[0] if missing else ''} has no replica: every expert keeps at "
                            f"least one slot")
        per_gpu = r // g
        on_gpu = [sorted(got[i * per_gpu:(i + 1) * per_gpu].tolist()) for i in range(g)]
        ref_p2l, _, ref_cnt = eplb.rebalance_experts(load[None].float(), r, 1, 1, g)
        ref_on_gpu = [sorted(ref_p2l[0, i * per_gpu:(i + 1) * per_gpu].tolist()) for i in range(g)]
        mine = eplb.max_over_mean(eplb.gpu_loads(load[None], got[None], counts[None], g))
        theirs = eplb.max_over_mean(eplb.gpu_loads(load[None], ref_p2l, ref_cnt, g))
        if sorted(on_gpu) == sorted(ref_on_gpu) or mine <= theirs * (1 + 1e-9):
            continue
        flat = [sorted(got[i::g].tolist()) for i in range(g)]
        if sorted(flat) == sorted(ref_on_gpu):  # before the mistakes: read GPU by GPU in turn, it is EPLB's placement
            fail(f"{what}: the slots are listed GPU by GPU in turn (slot p on GPU p % num_gpus): slot p lives on GPU "
                 f"p // (num_replicas // num_gpus), so list GPU 0's {per_gpu} slots first, then GPU 1's, ...")
        uneven = placement(load, r, g, "no_capacity")
        if any(len(gpu) != per_gpu for gpu in uneven) and _chunks(got.tolist(), [len(gpu) for gpu in uneven]) == \
                sorted(sorted(gpu) for gpu in uneven):
            fail(f"{what}: a GPU took more than num_replicas // num_gpus = {per_gpu} replicas (GPU sizes "
                 f"{[len(gpu) for gpu in uneven]}): every GPU has exactly {per_gpu} slots -- pack each replica into "
                 f"the lightest GPU that still has a free slot")
        for mistake, message in MISTAKES.items():
            wrong = placement(load, r, g, mistake)
            if sorted(sorted(x) for x in wrong) == sorted(on_gpu):
                fail(f"{what}: {message} (max/mean load {mine:.3f}, the lab's EPLB {theirs:.3f})")
        fail(f"{what}: max/mean GPU load {mine:.3f}, the lab's EPLB reaches {theirs:.3f} (GPU 0 holds experts "
             f"{on_gpu[0]}, EPLB puts {ref_on_gpu[0]} there)")
    return (f"the same GPUs' loads as the lab's EPLB on {len(shapes)} layers of random loads, one where the slots per GPU bind (max/mean GPU load equal "
            f"to EPLB's or lower)")

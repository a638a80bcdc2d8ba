"""Checkers for lab 09 (GB200 NVL72 topology): rack aggregates, dense vs sparse FLOPs, memory per GPU of a
parallelism layout, all-to-all time inside vs across the NVLink domain, and the build exercise: placing a job's ranks
on GPU ids (common.systems.cluster.placement is its reference and its traffic model)."""
from __future__ import annotations

from common.core.checks import checker, expect, expect_close, fail, near
from common.exercises.cases import as_number, learner_call, replayable
from common.exercises.formulas import answered, name_formula
from common.systems.cluster import topology

NUMBER = "one number (a float)"


@checker("9.1", "rack aggregate NVLink bandwidth")
@replayable
def check_aggregate_nvlink(aggregate_nvlink_tbs, cases):
    """aggregate_nvlink_tbs(gpus, per_gpu_gbs) -> TB/s, the sum of the per-GPU (bidirectional) figures."""
    rng = cases.rng
    cases_ = [(72, 1800, False), (8, 900, False), (8, 400, False), (576, 1800, False)] + [
        (rng.randint(2, 600), rng.choice([400, 600, 900, 1800, rng.uniform(100, 3600)]), True) for _ in range(5)]
    for gpus, per_gpu, is_random in cases_:
        expected = gpus * per_gpu / 1e3
        where = f"aggregate_nvlink_tbs({gpus}, {per_gpu:.6g}){cases.tag(is_random)}"
        got = as_number(learner_call(aggregate_nvlink_tbs, (gpus, per_gpu), where, (topology.aggregate_nvlink_tbs,),
                                     library=True), where, NUMBER)
        if near(got, expected * 1e3):
            expect(False, f"aggregate_nvlink_tbs({gpus}, {per_gpu}) = {got:.6g}: that is GB/s; the answer is in "
                          f"TB/s (1 TB/s = 1000 GB/s), so expected {expected:.6g}")
        if near(got, expected / 2):
            expect(False, f"aggregate_nvlink_tbs({gpus}, {per_gpu}) = {got:.6g}: you halved the per-GPU figure; "
                          f"the rack headline (130 TB/s) adds up NVIDIA's bidirectional per-GPU figures as quoted")
        if near(got, per_gpu / 1e3) and gpus > 1:
            expect(False, f"aggregate_nvlink_tbs({gpus}, {per_gpu}) = {got:.6g}: that is one GPU's figure -- "
                          f"multiply by the number of GPUs")
        expect_close(got, expected, f"aggregate_nvlink_tbs({gpus}, {per_gpu:.6g}){cases.tag(is_random)}", rtol=1e-9)
    return f"right for {len(cases_)} racks and nodes (NVL72: 72 x 1.8 TB/s = 129.6 TB/s)"


RACK_MISTAKES = [  # (what it is, what that mistake returns): named when every case matches it
    ("the sparse flag is read backwards: halve the datasheet (sparse) rate when sparse is False",
     lambda g, t, s: g * t / 1e3 / (2 if s else 1)),
    ("you doubled the rate for dense; the datasheet rate is the sparse one and dense is HALF of it",
     lambda g, t, s: g * t / 1e3 * (1 if s else 2)),
    ("dense is a quarter here; 2:4 sparsity doubles the rate, so dense is HALF the sparse figure",
     lambda g, t, s: g * t / 1e3 / (1 if s else 4)),
    ("that is EFLOP/s (/1e6); the answer is in PFLOP/s: 1 PFLOP/s = 1000 TFLOP/s",
     lambda g, t, s: g * t / 1e6 / (1 if s else 2)),
    ("1 PFLOP/s is 1000 TFLOP/s, not 1024", lambda g, t, s: g * t / 1024 / (1 if s else 2)),
    ("a fixed 72 GPUs (an NVL72 rack); multiply by the `gpus` given", lambda g, t, s: 72 * t / 1e3 / (1 if s else 2)),
]


@checker("9.2", "dense vs sparse rack FLOPs")
@replayable
def check_rack_pflops(rack_pflops, cases):
    """rack_pflops(gpus, per_gpu_sparse_tflops, sparse) -> PFLOP/s of the rack, dense when sparse is False."""
    rng = cases.rng
    cases_ = [(72, 20000, True, False), (72, 20000, False, False), (8, 3958, False, False), (8, 3958, True, False)] + [
        (rng.randint(1, 600), rng.uniform(500, 40000), rng.random() < 0.5, True) for _ in range(6)]
    rows = []
    for gpus, sparse_tflops, sparse, is_random in cases_:
        expected = gpus * sparse_tflops / 1e3 / (1 if sparse else 2)
        where = f"rack_pflops({gpus}, {sparse_tflops:.6g}, sparse={sparse}){cases.tag(is_random)}"
        def ask():
            got = as_number(learner_call(rack_pflops, (gpus, sparse_tflops, sparse), where, (topology.rack_pflops,),
                                         library=True), where, NUMBER)
            return (where, (gpus, sparse_tflops, sparse), got, expected)
        if not answered(rows, ask):
            break
    name_formula(rows, RACK_MISTAKES, unit=" PFLOP/s")
    for where, (gpus, sparse_tflops, sparse), got, expected in rows:
        if not sparse and near(got, expected * 2):
            expect(False, f"rack_pflops({gpus}, {sparse_tflops:.6g}, sparse=False) = {got:.6g}: that is the "
                          f"sparse figure; the datasheet rate assumes 2:4 sparsity, dense is half of it "
                          f"({expected:.6g})")
        if sparse and near(got, expected / 2):
            expect(False, f"rack_pflops({gpus}, {sparse_tflops:.6g}, sparse=True) = {got:.6g}: you halved the "
                          f"rate, but the per-GPU figure given is already the sparse one")
        if near(got, expected * 1e3):
            expect(False, f"rack_pflops(...) = {got:.6g}: that is TFLOP/s; convert to PFLOP/s (/1000)")
        if gpus > 1 and near(got, expected / gpus):
            expect(False, f"{where} = {got:.6g}: that is one GPU's rate; multiply by the number of GPUs")
        expect_close(got, expected, where, rtol=1e-9)
    return "sparse = GPUs x datasheet rate; dense = half of it (NVL72 FP4: 1,440 PF sparse, 720 PF dense)"


def _reference_memory(dense, experts, tp, pp, dp, ep):
    model = topology.ModelSketch("m", dense, experts, 1, 1, 1)
    return topology.memory_per_gpu_gb(model, topology.Layout(tp=tp, pp=pp, dp=dp, ep=ep))["total"]


def _memory(dn, ex, tp, pp, dp, ep, weights=2, grads=2, adam=12, stages=True, ep_dense=False, all_sharded=False,
            dense_replicas=None):
    """GB per GPU as a learner might count it, one choice changed from the right count."""
    split = tp * (pp if stages else 1)
    d, e = dn / (split * (ep if ep_dense else 1)), ex / (split * ep)
    state = adam * (d / (dense_replicas or dp) + e / (dp // ep))
    if all_sharded:
        return ((weights + grads + adam) * (d / dp + e / (dp // ep))) / 1e9
    return ((weights + grads) * (d + e) + state) / 1e9


# the containers a learner may build (their checks are no part of the answer): a cheat through them is then named by
# the reference it reaches, not by Layout's validation
SKETCHES = ("common.systems.cluster.topology.Layout", "common.systems.cluster.topology.ModelSketch")
MEMORY_MISTAKES = [
    ("8 B of optimizer state per parameter: mixed-precision Adam keeps THREE FP32 values (the master copy, m and v), "
     "12 B", lambda *a: _memory(*a, adam=8)),
    ("the gradients are missing: each GPU holds BF16 weights AND BF16 gradients for its share (2 + 2 B)",
     lambda *a: _memory(*a, grads=0)),
    ("the weights the model computes with are BF16 (2 B); the FP32 copy is part of the 12 B of optimizer state",
     lambda *a: _memory(*a, weights=4)),
    ("ZeRO-1 shards only the optimizer state; every rank keeps its whole share of the BF16 weights and gradients",
     lambda *a: _memory(*a, all_sharded=True)),
    ("the layers are not split by PP; each pipeline stage holds 1/pp of them", lambda *a: _memory(*a, stages=False)),
    ("the dense parameters are split by EP too; EP splits only the routed experts (every EP rank holds the dense "
     "layers)", lambda *a: _memory(*a, ep_dense=True)),
    ("the dense parameters' optimizer state is sharded over dp / ep replicas; a dense parameter has all dp "
     "data-parallel replicas (only an expert has dp / ep)", lambda *a: _memory(*a, dense_replicas=a[4] // a[5])),
]


@checker("9.3", "memory per GPU of a parallelism layout")
@replayable
def check_memory_per_gpu(memory_per_gpu_gb, cases):
    """memory_per_gpu_gb(dense_params, expert_params, tp, pp, dp, ep) -> GB (1e9 bytes) of BF16 weights, BF16
    gradients and FP32 Adam state (12 B/param) per GPU, with ZeRO-1 sharding the optimizer state."""
    rng = cases.rng
    cases_ = [(17.1e9, 653.9e9, 1, 16, 128, 64, False), (400e9, 0.0, 8, 16, 16, 1, False),
              (17.1e9, 653.9e9, 8, 16, 16, 8, False), (30e9, 500e9, 2, 4, 32, 4, False)]
    for _ in range(5):
        ep = rng.choice([1, 2, 4, 8, 16, 64])
        dp = ep * rng.choice([1, 2, 4, 8])
        cases_.append((rng.uniform(1e9, 5e11), rng.choice([0.0, rng.uniform(1e10, 2e12)]), rng.choice([1, 2, 4, 8]),
                      rng.choice([1, 2, 4, 8, 16]), dp, ep, True))
    rows = []
    for dense, experts, tp, pp, dp, ep, is_random in cases_:
        expected = _reference_memory(dense, experts, tp, pp, dp, ep)
        where = (f"memory_per_gpu_gb({dense:.3g}, {experts:.3g}, tp={tp}, pp={pp}, dp={dp}, ep={ep})"
                 f"{cases.tag(is_random)}")
        def ask():
            got = as_number(learner_call(memory_per_gpu_gb, (dense, experts, tp, pp, dp, ep), where,
                                         (topology.memory_per_gpu_gb,), allowed=SKETCHES, library=True),
                            where, NUMBER)
            return (where, (dense, experts, tp, pp, dp, ep), got, expected)
        if not answered(rows, ask, 1e-6):
            break
    name_formula(rows, MEMORY_MISTAKES, rtol=1e-6, unit=" GB")
    for where, (dense, experts, tp, pp, dp, ep), got, expected in rows:
        if near(got, expected * 1e9 / 2**30):
            expect(False, f"{where} = {got:.6g}: that is GiB (2^30 bytes); the lab counts GB = 1e9 bytes, like "
                          f"the HBM sizes on datasheets (expected {expected:.6g})")
        no_zero = topology.memory_per_gpu_gb(topology.ModelSketch("m", dense, experts, 1, 1, 1),
                                             topology.Layout(tp=tp, pp=pp, dp=dp, ep=ep, zero1=False))["total"]
        if dp > 1 and near(got, no_zero):
            expect(False, f"{where} = {got:.6g}: the optimizer state is not sharded; ZeRO-1 splits each "
                          f"parameter's 12 B of Adam state over its data-parallel replicas (expected {expected:.6g})")
        if experts and ep > 1 and near(got, _reference_memory(dense + experts, 0.0, tp, pp, dp, 1)):
            expect(False, f"{where} = {got:.6g}: the routed experts are not split by EP; each EP rank holds "
                          f"1/ep of them")
        d, e = dense / (tp * pp), experts / (tp * pp * ep)
        if experts and ep > 1 and near(got, ((d + e) * 4 + 12 * (d + e) / dp) / 1e9) and not near(got, expected):
            expect(False, f"{where} = {got:.6g}: the experts' optimizer state is sharded over all {dp} DP ranks, but "
                          f"each expert has only dp / ep = {dp // ep} replicas to share it with")
        if experts and tp > 1 and near(got, _reference_memory(dense, experts * tp, tp, pp, dp, ep)) \
                and not near(got, expected):
            expect(False, f"{where} = {got:.6g}: the routed experts are not split by TP; TP splits every matrix")
        expect_close(got, expected, where, rtol=1e-6)
    return f"right for {len(cases_)} layouts, DeepSeek's PP16 x EP64 x DP128 among them"


def _a2a(b, group, domain, nv, net, per_peer=None, nv_rate=None, net_rate=None):
    """Seconds of the all-to-all as a learner might count it: per_peer bytes to each peer, at the rates given."""
    inside = min(group, domain)
    per_peer = b / group if per_peer is None else per_peer
    return max(per_peer * (inside - 1) / (nv * 1e9 if nv_rate is None else nv_rate),
               per_peer * (group - inside) / (net * 1e9 if net_rate is None else net_rate))


A2A_MISTAKES = [
    ("every peer got the whole buffer; a GPU sends bytes_per_gpu / group to each rank of the group",
     lambda b, g, d, nv, net: _a2a(b, g, d, nv, net, per_peer=b)),
    ("the bandwidths are in GB/s: multiply them by 1e9 for bytes per second",
     lambda b, g, d, nv, net: _a2a(b, g, d, nv, net, nv_rate=nv, net_rate=net)),
    ("you divided the bandwidths by 8, as if they were gigabits; GB/s are gigaBYTES per second",
     lambda b, g, d, nv, net: _a2a(b, g, d, nv, net, nv_rate=nv * 1e9 / 8, net_rate=net * 1e9 / 8)),
    ("everything went at network speed, but the ranks inside the NVLink domain are reached over NVLink",
     lambda b, g, d, nv, net: b * (g - 1) / g / (net * 1e9)),
    ("the network share is missing: the ranks outside the NVLink domain are reached over the network too",
     lambda b, g, d, nv, net: b * (min(g, d) - 1) / g / (nv * 1e9)),
    ("the NVLink share is missing: the ranks inside the domain take their share over NVLink",
     lambda b, g, d, nv, net: b * (g - min(g, d)) / g / (net * 1e9)),
    ("that is milliseconds; return seconds", lambda b, g, d, nv, net: 1e3 * _a2a(b, g, d, nv, net)),
]


@checker("9.4", "all-to-all time inside vs across the NVLink domain")
@replayable
def check_all_to_all_seconds(all_to_all_seconds, cases):
    """all_to_all_seconds(bytes_per_gpu, group, domain, nvlink_gbs, network_gbs) -> seconds; bandwidths in GB/s
    per direction; each GPU sends bytes/group to every rank of the group, itself included (that share stays)."""
    rng = cases.rng
    cases_ = [(1e9, 64, 8, 160, 50, False), (3e9, 16, 8, 200, 50, False), (1e9, 8, 8, 200, 50, False),
              (1e9, 64, 72, 900, 50, False), (1e9, 1, 8, 200, 50, False)]
    for _ in range(5):
        domain = rng.choice([4, 8, 72])
        cases_.append((rng.uniform(1e6, 1e10), rng.choice([2, 4, 8, 16, 32, 64, 128, 256]), domain,
                      rng.uniform(100, 900), rng.uniform(12.5, 100), True))
    rows = []
    for b, group, domain, nv, net, is_random in cases_:
        fab = topology.Fabric("f", domain, nv, net)
        expected = topology.all_to_all_seconds(b, group, fab)
        where = (f"all_to_all_seconds({b:.3g}, group={group}, domain={domain}, nvlink={nv:.4g}, network={net:.4g})"
                 f"{cases.tag(is_random)}")
        def ask():
            got = as_number(learner_call(all_to_all_seconds, (b, group, domain, nv, net), where,
                                         (topology.all_to_all_seconds,), library=True), where, NUMBER)
            return (where, (b, group, domain, nv, net), got, expected)
        if not answered(rows, ask, 1e-6):
            break
    name_formula(rows, A2A_MISTAKES, rtol=1e-6, unit=" s")
    for where, (b, group, domain, nv, net), got, expected in rows:
        inside = min(group, domain)
        if group > domain and near(got, max(b * (inside - 1) / group / (net * 1e9),
                                            b * (group - inside) / group / (nv * 1e9))) and not near(got, expected):
            expect(False, f"{where} = {got:.6g}: the bandwidths are swapped; the NVLink share goes at the NVLink "
                          f"rate, the share outside the domain at the network rate")
        if group < domain and near(got, max(b * (domain - 1) / group / (nv * 1e9), 0.0)) and not near(got, expected):
            expect(False, f"{where} = {got:.6g}: a group smaller than the domain has group - 1 peers, not domain - 1 "
                          f"(inside = min(group, domain))")
        t_nv, t_net = b * (inside - 1) / group / (nv * 1e9), b * (group - inside) / group / (net * 1e9)
        if group > domain and near(got, b * (group - 1) / group / (nv * 1e9)):
            expect(False, f"{where} = {got:.6g}: everything went at NVLink speed, but {group - inside} of the "
                          f"{group} ranks are outside the {domain}-GPU NVLink domain and are reached over the "
                          f"network")
        if t_nv > 0 and t_net > 0 and near(got, t_nv + t_net):
            expect(False, f"{where} = {got:.6g}: you added the NVLink and network times; both links carry their "
                          f"share at the same time, so the slower one sets the time ({expected:.6g})")
        if group > 1 and near(got, max(b * inside / group / (nv * 1e9), t_net)) and not near(expected, got):
            expect(False, f"{where} = {got:.6g}: the share a GPU keeps for itself does not cross any link "
                          f"(count group - 1 peers, not group)")
        expect_close(got, expected, where, rtol=1e-6, atol=0.0)
    return "max(NVLink share / NVLink bandwidth, network share / network bandwidth)"


# ---------------------------------------------------------------- 9.5, the build exercise: placing the job's ranks

def _place_cases(rng) -> list[tuple[str, object, topology.Layout, int]]:
    """(what, model, layout, domain): DeepSeek-V3 and a dense model on NVL72 racks and 8-GPU nodes, then random
    layouts on domains that are not multiples of the groups."""
    v3 = topology.model_sketch("deepseek_v3")
    dense = topology.dense_sketch("dense 400B (illustrative)", 400e9, 128, 16384)
    L = topology.Layout
    out = [("DeepSeek-V3's PP16 x EP64 x DP128 on NVL72 racks", v3, L(tp=1, pp=16, dp=128, ep=64), 72),
           ("DeepSeek-V3's PP16 x EP64 x DP128 on 8-GPU H800 nodes", v3, L(tp=1, pp=16, dp=128, ep=64), 8),
           ("DeepSeek-V3 with TP8 x EP8 on 8-GPU nodes", v3, L(tp=8, pp=16, dp=16, ep=8), 8),
           ("DeepSeek-V3 with TP2 x EP4 on 8-GPU nodes", v3, L(tp=2, pp=4, dp=16, ep=4), 8),
           ("a dense 400B model, TP8 x PP8 x DP32, on NVL72 racks", dense, L(tp=8, pp=8, dp=32), 72),
           ("a dense 400B model, TP16 x PP4 x DP32, on NVL72 racks", dense, L(tp=16, pp=4, dp=32), 72)]
    for _ in range(3):
        tp, ep = rng.choice([1, 2, 4]), rng.choice([1, 2, 4, 8])
        out.append(("a random layout [random case, seed {seed}]", v3,
                    L(tp=tp, pp=rng.choice([1, 2, 3, 4]), dp=ep * rng.randint(1, 4), ep=ep),
                    rng.choice([4, 6, 8, 12, 16, 36, 72])))
    return out


def _tokens_per_step() -> float:
    from common.systems.cluster import scaling
    return scaling.claim("deepseek_v3", "sequence_length") * scaling.claim("deepseek_v3", "batch_sequences")


def _split_group(kind, got, best, lay, domain) -> str:
    """Words for the first group of `kind` that the learner's placement spreads over more domains than the best."""
    from common.systems.cluster import placement
    ids = placement.check_placement(got, lay)
    for (name, doms), (_, doms_best), (_, idx) in zip(placement.spans(got, lay, domain, kind),
                                                      placement.spans(best, lay, domain, kind),
                                                      placement.groups(lay, kind)):
        if len(doms) <= len(doms_best):
            continue
        gpus = sorted(int(g) for g in ids[idx])
        size = len(gpus)
        where = f"GPUs {gpus[0]}-{gpus[-1]}" if gpus == list(range(gpus[0], gpus[-1] + 1)) else \
            f"GPUs {', '.join(map(str, gpus[:8]))}{', ...' if size > 8 else ''}"
        if kind == "tp":
            what = f"the TP group of stage {name[0]}, DP rank {name[1]}"
        elif kind == "ep":
            what = (f"the EP group of stage {name[0]}, DP ranks {name[1] * lay.ep}-{(name[1] + 1) * lay.ep - 1}"
                    + (f", tensor rank {name[2]}" if lay.tp > 1 else ""))
        elif kind == "dp":
            what = f"the DP group of stage {name[0]}, tensor rank {name[1]}"
        else:
            what = f"the pipeline of DP rank {name[0]}, tensor rank {name[1]}"
        listed = ", ".join(map(str, doms[:6])) + (f", ... ({len(doms)} domains)" if len(doms) > 6 else "")
        side_by_side = gpus == list(range(gpus[0], gpus[-1] + 1))
        if kind in ("tp", "ep") and size <= domain:
            head = f"{what} ({where}) spans domains {listed}, though its {size} GPUs fit in one {domain}-GPU domain"
            block = lay.tp * lay.ep
            apart = f"its members sit {gpus[1] - gpus[0]} GPUs apart" if size > 1 else ""
            if kind == "tp" and not side_by_side:
                return (f"{head}: {apart}, so another index varies faster than t; the tensor ranks of one (p, d) must "
                        f"be neighbours (t varies fastest)")
            if kind == "ep" and not side_by_side:
                return (f"{head}: {apart}, so another index (the stage p, or the group's position) varies faster than "
                        f"the group's DP ranks; an EP group is ep consecutive DP ranks (d // ep), placed side by side "
                        f"(t fastest, then d, then p)")
            unit = block if kind == "ep" else lay.tp
            return (f"{head}: start each {'TP x EP block' if kind == 'ep' else 'TP group'} of {unit} GPUs at a domain "
                    f"boundary and leave the domain's last {domain % unit} GPUs idle")
        return (f"{what} ({where}) spans {len(doms)} domains where {len(doms_best)} suffice: keep the order t, then "
                f"d, then p, with whole groups per domain")
    return ""


@checker("9.5", "placing a job's ranks on GPU ids")
@replayable
def check_place(place, cases):
    """place(tp, ep, pp, dp, domain) -> gpu[p][d][t], GPU ids (domain g // domain); judged by the bytes per step it
    sends between domains (common.systems.cluster.placement) against the reference placement's."""
    from common.systems.cluster import placement
    tokens = _tokens_per_step()
    named = _place_cases(cases.rng)
    saved = []
    for what, model, lay, domain in named:
        what = what.format(seed=cases.seed)
        call = f"place(tp={lay.tp}, ep={lay.ep}, pp={lay.pp}, dp={lay.dp}, domain={domain}) for {what}"
        got = learner_call(place, (lay.tp, lay.ep, lay.pp, lay.dp, domain), call, (placement.place,),
                           expected="gpu[p][d][t], an array of GPU ids of shape (pp, dp, tp)", library=True)
        if got is None:
            fail(f"{call} returned None -- return gpu[p][d][t], an array of GPU ids of shape (pp, dp, tp)")
        try:
            ids = placement.check_placement(got, lay)
        except ValueError as exc:
            fail(f"{call}: {exc}")
        best = placement.place(lay.tp, lay.ep, lay.pp, lay.dp, domain)
        vol = placement.volumes(model, lay, tokens)
        mine, ref = placement.crossing_bytes(ids, lay, domain, vol), placement.crossing_bytes(best, lay, domain, vol)
        used, needed = placement.domains_used(ids, domain), placement.domains_used(best, domain)
        expect(used <= needed, f"{call}: your placement spreads the job over {used} domains of {domain} GPUs; "
                               f"{needed} hold it ({mine['total'] / 1e12:,.2f} TB per step between them, the best "
                               f"{ref['total'] / 1e12:,.2f}): fill a domain with as many whole TP x EP blocks as fit "
                               f"before starting the next")
        if mine["total"] > ref["total"] * (1 + 1e-9) + 1e-3:
            worse = [k for k in placement.KINDS if mine[k] > ref[k] * (1 + 1e-9) + 1e-3]
            detail = _split_group(worse[0], ids, best, lay, domain) if worse else ""
            kinds = ", ".join(f"{k.upper()} {mine[k] / 1e12:,.2f} vs {ref[k] / 1e12:,.2f}" for k in worse)
            fail(f"{call}: {mine['total'] / 1e12:,.2f} TB per step cross between domains, the best placement sends "
                 f"{ref['total'] / 1e12:,.2f} TB ({kinds})" + (f"; {detail}" if detail else ""))
        saved.append((what, ref["total"], used))
    v3_racks = saved[0][2]
    return (f"right for {len(named)} layouts: no group that fits in a domain is split, as little as the best sends "
            f"between domains (DeepSeek-V3 on NVL72 racks: {v3_racks} racks, {saved[0][1] / 1e12:,.1f} TB per step)")

"""Lab 09's named wrong answers (issue 46): for 9.2-9.5, beyond the three of each in test_wrong_answers.py --
look-alike formulas that only some cases separate (a flag read backwards, a doubled factor, a missing split), unit
slips, and cheats that call the workbook's own topology and placement code."""
from common.exercises import lab09
from common.systems.cluster import placement, topology
from test_exercises_lab09 import PLACE_MISTAKES, right_a2a, right_memory


def _rack(g, t, s):
    return g * t / 1e3 / (1 if s else 2)


def _memory(d, e, tp, pp, dp, ep, **change):
    return lab09._memory(d, e, tp, pp, dp, ep, **change)


WRONG = {
    lab09.check_rack_pflops: [
        (lambda g, t, s: g * t / 2e3, "already the sparse one"),
        (lambda g, t, s: g * t / 1e3 / (2 if s else 1), "sparse flag is read backwards"),
        (lambda g, t, s: g * t / 1e3 * (1 if s else 2), "doubled the rate for dense"),
        (lambda g, t, s: g * t / 1e3 / (1 if s else 4), "dense is a quarter"),
        (lambda g, t, s: _rack(g, t, s) / 1e3, "that is EFLOP/s"),
        (lambda g, t, s: g * t / 1024 / (1 if s else 2), "not 1024"),
        (lambda g, t, s: _rack(72, t, s), "a fixed 72 GPUs"),
        (lambda g, t, s: topology.rack_pflops(g, t if s else t / 2),
         "called common.systems.cluster.topology.rack_pflops, the reference"),
    ],
    lab09.check_memory_per_gpu: [
        (lambda d, e, tp, pp, dp, ep: ((d / (tp * pp) + e / (tp * pp * ep)) * 4 +
                                       12 * (d / (tp * pp) + e / (tp * pp * ep)) / dp) / 1e9,
         "sharded over all 128 DP ranks"),
        (lambda d, e, tp, pp, dp, ep: right_memory(d, e * tp, tp, pp, dp, ep), "not split by TP"),
        (lambda *a: _memory(*a, adam=8), "THREE FP32 values"),
        (lambda *a: _memory(*a, grads=0), "the gradients are missing"),
        (lambda *a: _memory(*a, weights=4), "weights the model computes with are BF16"),
        (lambda *a: _memory(*a, all_sharded=True), "ZeRO-1 shards only the optimizer state"),
        (lambda *a: _memory(*a, stages=False), "not split by PP"),
        (lambda *a: _memory(*a, ep_dense=True), "dense parameters are split by EP too"),
        (lambda *a: _memory(*a, dense_replicas=a[4] // a[5]), "a dense parameter has all dp"),
        (lambda d, e, tp, pp, dp, ep: topology.memory_per_gpu_gb(topology.ModelSketch("m", d, e, 1, 1, 1),
                                                                 topology.Layout(tp=tp, pp=pp, dp=dp, ep=ep))["total"],
         "called common.systems.cluster.topology.memory_per_gpu_gb, the reference"),
    ],
    lab09.check_all_to_all_seconds: [
        (lambda b, g, d, nv, net: b * (g - 1) / g / (nv * 1e9), "everything went at NVLink speed"),
        (lambda b, g, d, nv, net: max(b * (d - 1) / g / (nv * 1e9), b * (g - d) / g / (net * 1e9)),
         "not domain - 1"),
        (lambda b, g, d, nv, net: lab09._a2a(b, g, d, nv, net, per_peer=b), "every peer got the whole buffer"),
        (lambda b, g, d, nv, net: lab09._a2a(b, g, d, nv, net, nv_rate=nv, net_rate=net), "multiply them by 1e9"),
        (lambda b, g, d, nv, net: right_a2a(b, g, d, nv / 8, net / 8), "as if they were gigabits"),
        (lambda b, g, d, nv, net: b * (g - 1) / g / (net * 1e9), "everything went at network speed"),
        (lambda b, g, d, nv, net: b * (min(g, d) - 1) / g / (nv * 1e9), "the network share is missing"),
        (lambda b, g, d, nv, net: b * (g - min(g, d)) / g / (net * 1e9), "the NVLink share is missing"),
        (lambda *a: 1e3 * right_a2a(*a), "that is milliseconds"),
        (lambda b, g, d, nv, net: topology.all_to_all_seconds(b, g, topology.Fabric("f", d, nv, net)),
         "called common.systems.cluster.topology.all_to_all_seconds, the reference"),
    ],
    lab09.check_place: [(wrong, words) for wrong, words in PLACE_MISTAKES if "ZeroDivision" not in words] + [
        (lambda tp, ep, pp, dp, dom: placement.place(tp, ep, pp, dp, dom),
         "called common.systems.cluster.placement.place, the reference"),
        (lambda tp, ep, pp, dp, dom: placement.contiguous(tp, ep, pp, dp),
         "called common.systems.cluster.placement.contiguous, the workbook's own code"),
    ],
}

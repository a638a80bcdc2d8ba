"""Lab 09 checkers: right answers pass, each classic mistake fails with a telling message, stubs are not attempted."""
import pytest

from common.core.checks import CheckFailed
from common.exercises.lab09 import (
    check_aggregate_nvlink,
    check_all_to_all_seconds,
    check_memory_per_gpu,
    check_rack_pflops,
)
from common.systems.cluster import topology
from test_wrong_answers import run_named


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise: replace this line with your code")


# ---- 9.1
def test_aggregate_nvlink_right_and_stub():
    assert check_aggregate_nvlink(lambda g, b: g * b / 1000).passed
    assert check_aggregate_nvlink(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda g, b: g * b, r"that is GB/s"),
    (lambda g, b: g * b / 2000, r"halved"),
    (lambda g, b: b / 1000, r"one GPU's figure"),
    (lambda g, b: None, r"returned None"),
])
def test_aggregate_nvlink_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_aggregate_nvlink(wrong)


# ---- 9.2
def test_rack_pflops_right_and_stub():
    assert check_rack_pflops(lambda g, t, s: g * t / 1000 / (1 if s else 2)).passed
    assert check_rack_pflops(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda g, t, s: g * t / 1000, r"that is the sparse figure"),
    (lambda g, t, s: g * t / 2000, r"already the sparse one"),
    (lambda g, t, s: g * t / (1 if s else 2), r"TFLOP/s"),
])
def test_rack_pflops_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_rack_pflops(wrong)


# ---- 9.3
def right_memory(dense, experts, tp, pp, dp, ep):
    d, e = dense / (tp * pp), experts / (tp * pp * ep)
    return ((d + e) * 4 + 12 * (d / dp + e / (dp // ep))) / 1e9


def test_memory_per_gpu_right_and_stub():
    assert check_memory_per_gpu(right_memory).passed
    assert check_memory_per_gpu(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda *a: right_memory(*a) * 1e9 / 2**30, r"GiB"),
    (lambda dense, experts, tp, pp, dp, ep: (dense / (tp * pp) + experts / (tp * pp * ep)) * 16 / 1e9,
     r"not sharded"),
    (lambda dense, experts, tp, pp, dp, ep: right_memory(dense + experts, 0.0, tp, pp, dp, 1), r"not split by EP"),
    (lambda *a: right_memory(*a) * 1.1, r"expected"),
])
def test_memory_per_gpu_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_memory_per_gpu(wrong)


# ---- 9.4
def right_a2a(b, group, domain, nv, net):
    inside = min(group, domain)
    return max(b * (inside - 1) / group / (nv * 1e9), b * (group - inside) / group / (net * 1e9))


def test_all_to_all_right_and_stub():
    assert check_all_to_all_seconds(right_a2a).passed
    assert check_all_to_all_seconds(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda b, g, d, nv, net: b * (g - 1) / g / (nv * 1e9), r"NVLink speed"),
    (lambda b, g, d, nv, net: b * (min(g, d) - 1) / g / (nv * 1e9) + b * (g - min(g, d)) / g / (net * 1e9),
     r"added the NVLink and network times"),
    (lambda b, g, d, nv, net: max(b * min(g, d) / g / (nv * 1e9), b * (g - min(g, d)) / g / (net * 1e9)),
     r"keeps for itself"),
])
def test_all_to_all_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_all_to_all_seconds(wrong)


def test_reference_agrees_with_module():
    fab = topology.Fabric("f", 8, 160, 50)
    assert topology.all_to_all_seconds(1e9, 64, fab) == pytest.approx(right_a2a(1e9, 64, 8, 160, 50))


# ---- issue 12 audit: wrong types, seeds, parameters and mistakes the first version did not name
FIXED_91 = {(72, 1800): 129.6, (8, 900): 7.2, (8, 400): 3.2, (576, 1800): 1036.8}


@pytest.mark.parametrize("check, wrong, match", [
    (check_aggregate_nvlink, lambda g, b: str(g * b / 1000), r"returned str '129.6'; expected one number"),
    (check_aggregate_nvlink, lambda g, b: (g * b / 1000,), r"returned tuple"),
    (check_aggregate_nvlink, lambda g, b: FIXED_91.get((g, b), 1.0), r"random case, seed \d+"),
    (check_rack_pflops, lambda g, t, s: t / 1000 / (1 if s else 2), r"one GPU's rate"),
    (check_rack_pflops, lambda g, t, s: True, r"returned bool"),
    (check_memory_per_gpu, lambda d, e, tp, pp, dp, ep: ((d / (tp * pp) + e / (tp * pp * ep)) * 4 +
                                                         12 * (d / (tp * pp) + e / (tp * pp * ep)) / dp) / 1e9,
     r"sharded over all 128 DP ranks"),
    (check_memory_per_gpu, lambda d, e, tp, pp, dp, ep: right_memory(d, e * tp, tp, pp, dp, ep), r"not split by TP"),
    (check_memory_per_gpu, lambda *a: [right_memory(*a)], r"returned list"),
    (check_all_to_all_seconds, lambda b, g, d, nv, net: right_a2a(b, g, d, net, nv), r"bandwidths are swapped"),
    (check_all_to_all_seconds, lambda b, g, d, nv, net: max(b * (d - 1) / g / (nv * 1e9),
                                                            b * (g - d) / g / (net * 1e9)), r"not domain - 1"),
])
def test_audit_wrong(check, wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check(wrong)


def test_same_wrong_answer_fails_every_call():
    wrong = lambda b, g, d, nv, net: right_a2a(b, g, d, net, nv)  # noqa: E731
    for _ in range(5):
        with pytest.raises(CheckFailed):
            check_all_to_all_seconds(wrong)


@pytest.mark.parametrize("check, wrong", [
    (check_aggregate_nvlink, lambda g, b: topology.aggregate_nvlink_tbs(g, b)),
    (check_rack_pflops, lambda g, t, s: topology.rack_pflops(g, t if s else t / 2)),
    (check_all_to_all_seconds, lambda b, g, d, nv, net: topology.all_to_all_seconds(b, g, topology.Fabric("f", d, nv,
                                                                                                          net))),
])
def test_calling_the_reference_is_caught(check, wrong):
    with pytest.raises(CheckFailed, match=r"the reference this exercise asks you to write"):
        check(wrong)
    assert not hasattr(topology.all_to_all_seconds, "__wrapped_by_spy__")
    assert topology.all_to_all_seconds.__name__ == "all_to_all_seconds"


# ---- 9.5, the build exercise: placing a job's ranks on GPU ids
import numpy as np  # noqa: E402

from common.exercises.lab09 import check_place  # noqa: E402


def right_place(tp, ep, pp, dp, domain):
    """The lab's solution, as a learner writes it."""
    unit = tp * ep if tp * ep <= domain else (tp if tp <= domain else domain)
    usable = domain // unit * unit
    gpu = [[[0] * tp for _ in range(dp)] for _ in range(pp)]
    rank = 0
    for p in range(pp):
        for d in range(dp):
            for t in range(tp):
                gpu[p][d][t] = (rank // usable) * domain + rank % usable
                rank += 1
    return gpu


def _slots(tp, ep, pp, dp, domain, unit=None):
    unit = unit or (tp * ep if tp * ep <= domain else (tp if tp <= domain else domain))
    usable = domain // unit * unit
    r = np.arange(pp * dp * tp)
    return (r // usable) * domain + r % usable


def _block_always(tp, ep, pp, dp, domain):
    """Whole TP x EP blocks per domain, even when a block is larger than the domain (none fits: usable = 0)."""
    usable = domain // (tp * ep) * (tp * ep)
    return [[[(((p * dp + d) * tp + t) // usable) * domain + ((p * dp + d) * tp + t) % usable for t in range(tp)]
             for d in range(dp)] for p in range(pp)]


def _one_block_per_domain(tp, ep, pp, dp, domain):
    """Each TP x EP block starts a new domain, even when several fit in one."""
    block = tp * ep
    r = np.arange(pp * dp * tp)
    if block > domain:
        return _slots(tp, ep, pp, dp, domain).reshape(pp, dp, tp)
    return ((r // block) * domain + r % block).reshape(pp, dp, tp)


PLACE_MISTAKES = [  # (the wrong answer, the words that must name it): at least ten, as issue 42 asks
    (lambda tp, ep, pp, dp, dom: np.arange(pp * dp * tp).reshape(pp, dp, tp),
     r"EP group of stage 0, DP ranks 64-127 .* though its 64 GPUs fit in one 72-GPU domain: start each TP x EP block"),
    (lambda tp, ep, pp, dp, dom: _slots(tp, ep, pp, dp, dom, unit=tp if tp <= dom else dom).reshape(pp, dp, tp),
     r"EP group .* fit in one 72-GPU domain: start each TP x EP block"),
    (lambda tp, ep, pp, dp, dom: _slots(tp, ep, pp, dp, dom).reshape(tp, pp, dp).transpose(1, 2, 0),
     r"TP group of stage .* GPUs apart, so another index varies faster than t"),
    (lambda tp, ep, pp, dp, dom: _slots(tp, ep, pp, dp, dom).reshape(pp, ep, dp // ep, tp).transpose(0, 2, 1, 3)
     .reshape(pp, dp, tp), r"sit 2 GPUs apart.*an EP group is ep consecutive DP ranks"),
    (lambda tp, ep, pp, dp, dom: _slots(tp, ep, pp, dp, dom).reshape(dp, tp, pp).transpose(2, 0, 1),
     r"EP group of stage 0, DP ranks 0-63 .* its members sit 16 GPUs apart, so another index \(the stage p"),
    (lambda tp, ep, pp, dp, dom: _one_block_per_domain(tp, ep, pp, dp, dom),
     r"spreads the job over 256 domains of 72 GPUs; 29 hold it"),
    (lambda tp, ep, pp, dp, dom: np.zeros((pp, dp, tp), dtype=int), r"GPU 0 holds two ranks"),
    (lambda tp, ep, pp, dp, dom: _slots(tp, ep, pp, dp, dom).reshape(dp, pp, tp) if pp != dp else None,
     r"has shape \(128, 16, 1\); it must be \(pp, dp, tp\) = \(16, 128, 1\)"),
    (lambda tp, ep, pp, dp, dom: list(_slots(tp, ep, pp, dp, dom)), r"has shape \(2048,\)"),
    (lambda tp, ep, pp, dp, dom: _block_always(tp, ep, pp, dp, dom), r"ZeroDivisionError"),
    (lambda tp, ep, pp, dp, dom: (_slots(tp, ep, pp, dp, 8) // 8 * 8 + _slots(tp, ep, pp, dp, 8) % 8)
     .reshape(pp, dp, tp), r"EP group .* fit in one 72-GPU domain"),
    (lambda tp, ep, pp, dp, dom: -_slots(tp, ep, pp, dp, dom).reshape(pp, dp, tp), r"whole numbers >= 0"),
    (lambda tp, ep, pp, dp, dom: _slots(tp, ep, pp, dp, dom).reshape(pp, dp, tp) + 0.5, r"whole numbers >= 0"),
]


def test_place_right_and_stub():
    for seed in range(6):
        assert check_place(right_place, seed=seed).passed
    assert check_place(lambda *a: np.asarray(right_place(*a)) + 144).passed  # whole domains later: as good
    assert check_place(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", PLACE_MISTAKES, ids=[f"mistake{i}" for i in range(len(PLACE_MISTAKES))])
def test_place_wrong_answers_are_named(wrong, match):
    run_named(check_place, wrong, match, seeds=(0, 1))


def test_place_reference_is_caught():
    from common.systems.cluster import placement
    with pytest.raises(CheckFailed, match=r"called common.systems.cluster.placement.place"):
        check_place(lambda *a: placement.place(*a))


# ---- issue 46: right answers written differently pass; the library watch refuses the workbook's own code
@pytest.mark.parametrize("check, right", [
    (check_rack_pflops, lambda g, t, s: (t if s else 0.5 * t) * g * 1e-3),
    (check_rack_pflops, lambda g, t, s: g * t / (1000 * (2 - bool(s)))),
    (check_memory_per_gpu, lambda d, e, tp, pp, dp, ep: (4 * (d + e / ep) / (tp * pp)
                                                         + 12 * (d / dp + e * ep / dp / ep) / (tp * pp)) * 1e-9),
    (check_all_to_all_seconds, lambda b, g, d, nv, net: max(0.0, b / g * (min(g, d) - 1) / nv,
                                                            b / g * max(0, g - d) / net) / 1e9),
])
def test_right_answers_written_differently(check, right):
    for seed in range(3):
        assert check(right, seed=seed).passed


def test_library_cheats_are_refused():
    from common.systems.cluster import placement
    with pytest.raises(CheckFailed, match=r"called common.systems.cluster.placement.contiguous, the workbook's own"):
        check_place(lambda tp, ep, pp, dp, dom: placement.contiguous(tp, ep, pp, dp))

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

"""A learner's function that calls the workbook's library instead of doing the exercise is refused, whatever name it
used to reach it (common/exercises/cases.py `watched`, `learner_call(..., library=True)`), in a kernel and through
the grader's wire format alike."""
import pytest

from common.core import checks
from common.core.checks import CheckFailed
from common.exercises import cases, remote
from common.exercises.cases import learner_call, watched
from common.kernels import roofline


def _gemm_via_library(m, n, k):
    from common.kernels.roofline import gemm_cost as hidden  # another name, imported inside the function
    return hidden(m, n, k, "bf16").flops


def _gemm_by_hand(m, n, k):
    return 2 * m * n * k


def test_a_call_into_the_library_is_named_whatever_the_name():
    with pytest.raises(CheckFailed, match=r"called common\.kernels\.roofline\.gemm_cost, the workbook's own code"):
        learner_call(_gemm_via_library, (2, 3, 4), "flops(2, 3, 4)", library=True)
    assert learner_call(_gemm_by_hand, (2, 3, 4), "flops(2, 3, 4)", library=True) == 48


def test_what_the_exercise_hands_the_learner_is_allowed():
    got = learner_call(_gemm_via_library, (2, 3, 4), "flops(2, 3, 4)", library=True,
                       allowed=("common.kernels.roofline.gemm_cost",))
    assert got == 48
    assert learner_call(_gemm_via_library, (2, 3, 4), "flops(2, 3, 4)", library=True,
                        allowed=("common.kernels.roofline",)) == 48  # a module prefix allows the module


def test_the_checkers_own_calls_into_the_library_are_not_the_learners():
    with watched((), library=True) as called:
        roofline.gemm_cost(2, 3, 4, "bf16")  # this test module is outside common/: as a learner's cell would be
    assert called == ["common.kernels.roofline.gemm_cost"]

    def callback():  # a checker's callback, defined in common/, calling the library: not the learner's call
        return roofline.gemm_cost(2, 3, 4, "bf16")
    callback.__code__ = callback.__code__.replace(co_filename=cases.__file__)  # as if in common/exercises
    with watched((), library=True) as called:
        callback()
    assert called == []


def test_the_grader_sees_the_same_route(monkeypatch):
    @checks.checker("98.7", "flops of a GEMM, by hand")
    def check_flops(fn):
        learner_call(fn, (2, 3, 4), "flops(2, 3, 4)", library=True)

    monkeypatch.setattr(checks, "submission_hook", remote.loopback_hook)
    with pytest.raises(CheckFailed, match=r"called common\.kernels\.roofline\.gemm_cost"):
        check_flops(_gemm_via_library)
    check_flops(_gemm_by_hand)
    assert checks.status("98.7") == checks.PASSED

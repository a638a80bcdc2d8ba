"""Lab 08 checkers: right answers pass, each classic mistake fails with a telling message, stubs are 'not attempted'."""
import pytest

from common.core.checks import CheckFailed
from common.exercises.lab08 import check_bubble, check_dualpipe_pairs, check_one_f_one_b_order
from common.parallel import pipeline


def _stub(*args):
    raise NotImplementedError("Exercise 8.x: not yet")


# --- 8.1 the 1F1B order
def right_order(pp, m, stage):
    warm = min(pp - 1 - stage, m)
    order = [("F", j) for j in range(warm)]
    for j in range(m - warm):
        order += [("F", warm + j), ("B", j)]
    return order + [("B", j) for j in range(m - warm, m)]


def gpipe_order(pp, m, stage):
    return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]


def too_many_warmup(pp, m, stage):
    warm = min(pp - stage, m)
    order = [("F", j) for j in range(warm)]
    for j in range(m - warm):
        order += [("F", warm + j), ("B", j)]
    return order + [("B", j) for j in range(m - warm, m)]


def reversed_warmup(pp, m, stage):
    return right_order(pp, m, pp - 1 - stage)


def missing_last_backward(pp, m, stage):
    return right_order(pp, m, stage)[:-1]


def test_one_f_one_b_right():
    assert check_one_f_one_b_order(right_order).passed


def test_one_f_one_b_gpipe():
    with pytest.raises(CheckFailed, match="GPipe"):
        check_one_f_one_b_order(gpipe_order)


def test_one_f_one_b_too_many_in_flight():
    with pytest.raises(CheckFailed, match="in flight"):
        check_one_f_one_b_order(too_many_warmup)


def test_one_f_one_b_warmup_reversed():
    with pytest.raises(CheckFailed, match="micro-batches in flight"):
        check_one_f_one_b_order(reversed_warmup)


def test_one_f_one_b_missing_item():
    with pytest.raises(CheckFailed, match="exactly one"):
        check_one_f_one_b_order(missing_last_backward)


def test_one_f_one_b_stub():
    assert check_one_f_one_b_order(_stub).status == "not attempted"


# --- 8.2 bubbles
def right_bubble(name, pp, F, B, W, FB):
    if name in ("gpipe", "1f1b"):
        return (pp - 1) * (F + B)
    if name == "zb1p":
        return (pp - 1) * (F + B - 2 * W)
    return (pp // 2 - 1) * (FB + B - 3 * W)


def dualpipe_full_ramp(name, pp, F, B, W, FB):
    return (pp - 1) * (FB + B - 3 * W) if name == "dualpipe" else right_bubble(name, pp, F, B, W, FB)


def zb_one_w(name, pp, F, B, W, FB):
    return (pp - 1) * (F + B - W) if name == "zb1p" else right_bubble(name, pp, F, B, W, FB)


def bubble_fraction(name, pp, F, B, W, FB):
    return right_bubble(name, pp, F, B, W, FB) / pp


def no_return(name, pp, F, B, W, FB):
    (pp - 1) * (F + B)


def test_bubble_right():
    assert check_bubble(right_bubble).passed


def test_bubble_dualpipe_ramp():
    with pytest.raises(CheckFailed, match="PP/2 - 1"):
        check_bubble(dualpipe_full_ramp)


def test_bubble_zb_one_w():
    with pytest.raises(CheckFailed, match="2W per stage"):
        check_bubble(zb_one_w)


def test_bubble_divided_by_pp():
    with pytest.raises(CheckFailed, match="divides by PP"):
        check_bubble(bubble_fraction)


def test_bubble_none():
    with pytest.raises(CheckFailed, match="None"):
        check_bubble(no_return)


def test_bubble_stub():
    assert check_bubble(_stub).status == "not attempted"


# --- 8.3 DualPipe stage pairs
def right_pairs(pp):
    if pp % 2:
        raise ValueError(f"pp={pp} must be even")
    return [(r, pp - 1 - r) for r in range(pp)]


def same_direction(pp):
    if pp % 2:
        raise ValueError("odd")
    return [(r, r) for r in range(pp)]


def off_by_one(pp):
    if pp % 2:
        raise ValueError("odd")
    return [(r, pp - r) for r in range(pp)]


def rotated(pp):
    if pp % 2:
        raise ValueError("odd")
    return [((r + 1) % pp, pp - 1 - r) for r in range(pp)]


def accepts_odd(pp):
    return [(r, pp - 1 - r) for r in range(pp)]


def test_pairs_right():
    assert check_dualpipe_pairs(right_pairs).passed


def test_pairs_same_direction():
    with pytest.raises(CheckFailed, match="same direction"):
        check_dualpipe_pairs(same_direction)


def test_pairs_off_by_one():
    with pytest.raises(CheckFailed, match="on distinct ranks"):
        check_dualpipe_pairs(off_by_one)


def test_pairs_rotated():
    with pytest.raises(CheckFailed, match="enter at rank 0"):
        check_dualpipe_pairs(rotated)


def test_pairs_odd_pp_accepted():
    with pytest.raises(CheckFailed, match="odd PP"):
        check_dualpipe_pairs(accepts_odd)


def test_pairs_stub():
    assert check_dualpipe_pairs(_stub).status == "not attempted"


def test_reference_matches_pipeline_module():
    assert [pipeline.dualpipe_stages(8, r) for r in range(8)] == [((0, r), (1, 7 - r)) for r in range(8)]


# --- issue 12 audit: parameters varied, edge cases, named mistakes, learner errors as verdicts, seeds printed
def hard_coded_pp(pp, m, stage):
    return right_order(4, m, min(stage, 3))


def backwards_reversed(pp, m, stage):
    order = right_order(pp, m, stage)
    bs = iter(sorted((j for k, j in order if k == "B"), reverse=True))
    return [(k, j) if k == "F" else ("B", next(bs)) for k, j in order]


def strings_not_pairs(pp, m, stage):
    return [f"{k}{j}" for k, j in right_order(pp, m, stage)]


@pytest.mark.parametrize("wrong,match", [(hard_coded_pp, "one_f_one_b_order"), (backwards_reversed, "in order"),
                                         (strings_not_pairs, "must be a pair")])
def test_one_f_one_b_audit(wrong, match):
    for _ in range(3):  # the same wrong answer fails on every call (fixed cases, not luck)
        with pytest.raises(CheckFailed, match=match):
            check_one_f_one_b_order(wrong)


def test_failure_prints_the_seed():
    with pytest.raises(CheckFailed, match=r"seed \d+"):
        check_one_f_one_b_order(gpipe_order)


def zb_as_forward_only(name, pp, F, B, W, FB):
    return (pp - 1) * F if name == "zb1p" else right_bubble(name, pp, F, B, W, FB)


def dualpipe_f_plus_b(name, pp, F, B, W, FB):
    return (pp // 2 - 1) * (F + B + B - 3 * W) if name == "dualpipe" else right_bubble(name, pp, F, B, W, FB)


def dualpipe_two_w(name, pp, F, B, W, FB):
    return (pp // 2 - 1) * (FB + B - 2 * W) if name == "dualpipe" else right_bubble(name, pp, F, B, W, FB)


def zb_as_1f1b(name, pp, F, B, W, FB):
    return (pp - 1) * (F + B) if name == "zb1p" else right_bubble(name, pp, F, B, W, FB)


def bubble_as_text(name, pp, F, B, W, FB):
    return f"{right_bubble(name, pp, F, B, W, FB):.2f}"


def bubble_ignores_timings(name, pp, F, B, W, FB):
    return right_bubble(name, pp, 1.0, 2.0, 1.0, 2.5)


@pytest.mark.parametrize("wrong,match", [(zb_as_forward_only, "zb1p"), (dualpipe_f_plus_b, "uses F \\+ B"),
                                         (dualpipe_two_w, "3W per ramp step"), (zb_as_1f1b, "1F1B's bubble"),
                                         (bubble_as_text, "expected a number"),
                                         (bubble_ignores_timings, "bubble\\('1f1b', pp=6")])
def test_bubble_audit(wrong, match):
    for _ in range(3):
        with pytest.raises(CheckFailed, match=match):
            check_bubble(wrong)


def asserts_even(pp):
    assert pp % 2 == 0, "pp must be even"
    return [(r, pp - 1 - r) for r in range(pp)]


def ints_not_pairs(pp):
    if pp % 2:
        raise ValueError("odd")
    return list(range(pp))


def accepts_one(pp):
    if pp % 2 and pp > 1:
        raise ValueError("odd")
    return [(r, pp - 1 - r) for r in range(pp)]


@pytest.mark.parametrize("wrong,match", [(asserts_even, "(?s)raised AssertionError.*expected ValueError"),
                                         (ints_not_pairs, "must be a pair"), (accepts_one, "dualpipe_pairs\\(1\\)")])
def test_pairs_audit(wrong, match):
    for _ in range(3):
        with pytest.raises(CheckFailed, match=match):
            check_dualpipe_pairs(wrong)


@pytest.mark.parametrize("check, reference", [
    (check_one_f_one_b_order, lambda pp, m, s: pipeline.one_f_one_b_order(pp, m, s)),
    (check_bubble, lambda name, pp, F, B, W, FB: pipeline.bubble_formula(name, pp, pipeline.Durations(F, B, W, FB))),
    (check_dualpipe_pairs, lambda pp: [pipeline.dualpipe_stages(pp, r) for r in range(pp)]),
])
def test_calling_the_reference_is_caught(check, reference):
    with pytest.raises(CheckFailed, match="reference this exercise asks you to write"):
        check(reference)

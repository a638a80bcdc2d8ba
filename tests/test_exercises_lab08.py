"""Lab 08 checkers: right answers pass, each classic mistake fails with a telling message, stubs are 'not attempted'."""
import pytest

from common.core.checks import CheckFailed
from common.exercises.lab08 import check_dualpipe_ops, check_one_f_one_b_order
from common.parallel import pipeline


def _stub(*args):
    raise NotImplementedError("Exercise 8.x: not yet")


# --- 8.1 the 1F1B order
def right_order(pp, m, stage, warm=None, b_first=False, first=0):
    """A learner's answer; the keywords put in one known mistake each (a warm-up of `warm` forwards, each steady
    pair backward first, micro-batches numbered from `first`)."""
    warm = min(pp - 1 - stage, m) if warm is None else warm
    order = [("F", j) for j in range(warm)]
    for j in range(m - warm):
        order += [("B", j), ("F", warm + j)] if b_first else [("F", warm + j), ("B", j)]
    return [(k, j + first) for k, j in order + [("B", j) for j in range(m - warm, m)]]


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
    with pytest.raises(CheckFailed, match="stages are numbered the other way"):
        check_one_f_one_b_order(reversed_warmup)


def test_one_f_one_b_missing_item():
    with pytest.raises(CheckFailed, match="exactly one"):
        check_one_f_one_b_order(missing_last_backward)


def test_one_f_one_b_stub():
    assert check_one_f_one_b_order(_stub).status == "not attempted"


# --- 8.2 one DualPipe rank's order from the eight steps' rules
def dualpipe_ops(pp, micro_batches, rank, warm=2, zb3=True, main_extra=0, split_middle=True, overlap=True,
                 f1_first=False, zb6=None, w_first=True, final_w=True, h=None, f0_second=False, b1_last=False):
    """A learner's answer; the keywords put in one known mistake each."""
    n, m = pp // 2, micro_batches // 2
    h = min(rank, pp - 1 - rank) if h is None else h
    out = ["F0"] * (warm * (n - h - 1))
    for _ in range(h + 1):
        out += ["F1", "F0"] if f0_second else ["F0", "F1"]
    out += (["Bi1", "W", "F1"] if zb3 else ["B1", "F1"]) * (n - h - 1)
    for i in range(m - 2 * n + h + 1 + main_extra):
        first = ["F0", "B1"] if not overlap or (split_middle and i == 0 and h == n - 1) else ["F0&B1"]
        out += ["F1&B0"] + first if f1_first else first + ["F1&B0"]
    out += (["F1&B0", "B1"] if b1_last else ["B1", "F1&B0"]) * (n - h - 1)
    backs = ["B1", "B0"] * (h + 1)
    zb_from = h + 1 if zb6 is None else zb6(h)
    out += [("Bi" + t[1]) if i >= zb_from else t for i, t in enumerate(backs)]
    out += (["W", "Bi0"] if w_first else ["Bi0", "W"]) * (n - h - 1)
    queued = sum(t.startswith("Bi") for t in out) - out.count("W")
    return out + ["W"] * queued if final_w else out


def _variant(**kw):
    def f(pp, micro_batches, rank):
        return dualpipe_ops(pp, micro_batches, rank, **kw)
    return f


def test_dualpipe_ops_right_and_stub():
    v = check_dualpipe_ops(dualpipe_ops)
    assert v.passed and "plans under NCCL's rules" in v.detail
    assert check_dualpipe_ops(_stub).status == "not attempted"


def test_dualpipe_ops_wrong():
    """The audit's named wrong answers (tests/wrong_answers/lab08.py), here on a fresh seed."""
    from wrong_answers.lab08 import WRONG
    for wrong, match in WRONG[check_dualpipe_ops]:
        with pytest.raises(CheckFailed, match=match):
            check_dualpipe_ops(wrong)


def strings_with_spaces(pp, micro_batches, rank):
    return [t.replace("&", " & ") for t in dualpipe_ops(pp, micro_batches, rank)]


def items_not_tokens(pp, micro_batches, rank):
    return pipeline.dualpipe(pp, micro_batches).ops[rank]


def test_dualpipe_ops_bad_returns_and_the_reference():
    with pytest.raises(CheckFailed, match=r"'F0 & B1' is not a token; allowed: F0, F1"):
        check_dualpipe_ops(strings_with_spaces, seed=1)
    with pytest.raises(CheckFailed, match=r"return a list of tokens|reference this exercise asks you to write"):
        check_dualpipe_ops(items_not_tokens, seed=1)
    with pytest.raises(CheckFailed, match="reference this exercise asks you to write"):
        check_dualpipe_ops(pipeline.dualpipe_tokens, seed=1)


def test_the_checkers_rules_are_deepseeks_order():
    from common.exercises.lab08 import _tokens
    for pp in (2, 4, 6, 8, 10):
        for m in range(2 * pp, 2 * pp + 10, 2):
            for r in range(pp):
                assert _tokens(pp, m, r) == pipeline.dualpipe_tokens(pp, m, r) == dualpipe_ops(pp, m, r)
    assert pipeline.schedule_from(dualpipe_ops, 8, 20).ops == pipeline.dualpipe(8, 20).ops


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


@pytest.mark.parametrize("check, reference", [
    (check_one_f_one_b_order, lambda pp, m, s: pipeline.one_f_one_b_order(pp, m, s)),
    (check_dualpipe_ops, lambda pp, m, r: pipeline.dualpipe_tokens(pp, m, r)),
])
def test_calling_the_reference_is_caught(check, reference):
    with pytest.raises(CheckFailed, match="reference this exercise asks you to write"):
        check(reference)


# --- right answers written differently (issue 46): none is refused, the library watch included
def order_by_counting(pp, m, stage):
    """Forward while fewer than pp - stage micro-batches are in flight, else backward: the same order."""
    out, f, b = [], 0, 0
    while b < m:
        if f < m and f - b < pp - stage:
            out.append(["F", f])
            f += 1
        else:
            out.append(["B", b])
            b += 1
    return out


def test_right_answers_written_differently():
    for seed in (1, 2):
        assert check_one_f_one_b_order(order_by_counting, seed=seed).passed
        assert check_dualpipe_ops(lambda pp, m, r: tuple(dualpipe_ops(pp, m, r)), seed=seed).passed

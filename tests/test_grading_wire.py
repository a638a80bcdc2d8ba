"""The grader's wire format, in one process (common.exercises.remote.loopback): values cross as data only, a
checker judging a stand-in for the learner's function gives the same verdict as in the learner's kernel -- in-place
changes to the arguments, a result that is an argument, the grader's own objects used from the kernel, blocks
streamed through one buffer, the learner's exceptions by type, and calls of the reference."""
import numpy as np
import pytest
import torch

from common.core import checks
from common.core.checks import checker, expect, expect_equal
from common.core.grading import codec
from common.core.grading.channel import dumps, loads
from common.exercises.cases import Streamed, learner_call
from common.exercises.remote import loopback


def test_values_round_trip_as_data():
    from common.kernels import lowp
    values = [None, True, 3, -2**70, 1.5, float("inf"), float("nan"), "s", b"\x00b", (1, [2, {"a": {3}}]),
              {1: "int key", "$": "dollar"}, frozenset({1, 2}), range(2, 9, 3), slice(1, None),
              torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), torch.zeros(0, 4), torch.float8_e4m3fn,
              torch.Size([2, 3]), np.arange(4, dtype=np.int16), np.float32(2.5), np.dtype("float64"), lowp.e4m3]
    for v in values:
        back = codec.decode(loads(dumps({"v": codec.encode(v)}))["v"])
        if isinstance(v, torch.Tensor):
            assert back.dtype == v.dtype and torch.equal(back.float(), v.float())
        elif isinstance(v, np.ndarray):
            assert back.dtype == v.dtype and np.array_equal(back, v)
        elif isinstance(v, float) and v != v:
            assert back != back
        else:
            assert back == v and type(back) is type(v), (v, back)


def test_decoding_runs_no_code_of_the_sender():
    for bad in ({"$": "dataclass", "cls": "os:system", "v": {}}, {"$": "enum", "cls": "builtins:eval", "v": "x"},
                {"$": "tdtype", "v": "Tensor"}, {"$": "ndarray", "dtype": "|O", "shape": [1], "v": ""},
                {"$": "tensor", "dtype": "float32", "shape": [4], "v": "AAAA", "grad": False, "device": "cpu"},
                {"$": "obj", "id": 1, "kind": "callable"}, {"$": "pickle", "v": "gASVAA=="}):
        with pytest.raises((ValueError, KeyError, TypeError)):
            codec.decode(bad)
    learner_object = codec.decode(codec.encode(object(), strict=False))
    assert isinstance(learner_object, codec.Opaque) and "object" in repr(learner_object)
    with pytest.raises(codec.NotSendable):
        codec.encode(object())


@checker("99.7", "wire demo")
def check_wire(fn):
    x = torch.arange(4.0)
    items = [3, 1, 2]
    seen = []
    got = learner_call(fn, (x, items, seen.append, Streamed(torch.ones(2, 2) * i for i in range(3))), "fn(...)")
    expect(torch.equal(x, torch.arange(4.0)), "fn modified its input x in place")
    expect_equal(items, [3, 1, 2], "items")
    expect(seen == ["hello"], f"the callback saw {seen}")
    expect(got is not x, "fn returned its input x itself")
    return "ok"


def _right(x, items, say, blocks):
    say("hello")
    total = 0.0
    for b in blocks:
        total += float(b.sum())
    return x * 2 + total


@pytest.mark.parametrize("fn, words", [
    (_right, None),
    (lambda x, items, say, blocks: (x.add_(1), say("hello"))[0], "modified its input x in place"),
    (lambda x, items, say, blocks: (items.sort(), say("hello"), x * 2)[2], "items: first difference"),
    (lambda x, items, say, blocks: (say("hello"), x)[1], "returned its input x itself"),
    (lambda x, items, say, blocks: [][1], "your code raised IndexError: list index out of range"),
])
def test_a_verdict_through_the_wire_is_the_kernels(fn, words):
    local = checks.judge("99.7", fn)
    remote = loopback("99.7", (fn,))
    assert local.status == remote.status
    if words:
        assert words in local.detail and words in remote.detail, (local.detail, remote.detail)


def test_the_graders_objects_and_the_reference_cross_the_wire():
    from common.exercises import lab06, lab12
    from common.core import traces
    v = loopback("6.3", (lambda x, w, i, experts: sum(experts.forward(int(e), x) * 0 for e in range(2)),))
    assert v.status == "failed" and "NotSendable" not in v.detail  # the counting experts were usable remotely
    assert lab06 and lab12
    v = loopback("12.1", (traces.idle_share,))
    assert v.status == "failed" and "reference this exercise asks you to write" in v.detail


def test_this_rounds_exercises_pass_as_the_grader_judges_them(monkeypatch):
    """The right answers of labs 11-14's exercises pass when judged as the grader judges them (through the wire, or in
    the kernel where the checker says so): 12.5 once returned a torch.profiler object that could not cross the wire
    and was graded 'failed' on the solution notebook."""
    import test_exercises_lab11 as t11
    import test_exercises_lab12 as t12
    import test_exercises_lab13 as t13
    import test_exercises_lab14 as t14
    from common.exercises import lab11, lab12, lab13, lab14, remote
    monkeypatch.setattr(checks, "submission_hook", remote.loopback_hook)
    for check, right in [(lab11.check_checkpoint_seconds, t11._ckpt), (lab12.check_idle_share, t12._idle),
                         (lab12.check_corrected_share, t12._corrected), (lab12.check_profile_steps, t12._profile_steps),
                         (lab12.check_top_op, t12._top_op), (lab13.check_moe_layer_flops, t13.right_flops),
                         (lab13.check_exposed_all_to_all, t13.right_exposed), (lab13.check_gpu_hours, t13.right_hours),
                         (lab14.check_kv_bytes_per_token, t14.right_kv), (lab14.check_absorbed_attention, t14.absorbed),
                         (lab14.check_gather_paged, t14.right_gather), (lab14.check_decode_intensity, t14.right_intensity),
                         (lab14.check_cost_per_m_tokens, t14.right_cost)]:
        v = check(right)
        assert v.passed, (check.__name__, v.detail)


def test_a_graders_object_has_truthiness():
    """`rng = rng or random.Random()` on the grader's Random: truth asked of the object, not its len() (12.4's
    solution was graded 'failed' with "object of type 'Random' has no len()")."""
    from test_exercises_lab12 import guard

    from common.exercises import lab12
    assert lab12 and loopback("12.4", (guard,)).passed

"""Pipeline schedules executed on real ranks (gloo): gradients match one process, bad input fails before launch."""
import pytest

from common.parallel import pipeline_run as R


def test_zero_bubble_split_gives_the_full_backward():
    """Bi (input gradients, weight parts queued) then W gives the same gradients as one full backward."""
    model = R.make_model(2, 8)
    params = [[t.clone().requires_grad_() for t in blk] for blk in model]
    x, t = R.make_batch(4, 8)
    R._WeightGrads.key = ("Bi", 0, 0)
    try:
        R.loss_of(R.stage_forward(params, x), t, 4).backward()
    finally:
        R._WeightGrads.key = None
    assert all(p.grad is None for blk in params for p in blk)  # the weights waited for W
    for fn in R._WeightGrads.pending.pop(("Bi", 0, 0)):
        fn()
    ref = R.reference_gradients(2, 8, 4)
    for blk, rb in zip(params, ref):
        for p, r in zip(blk, rb):
            assert not p.grad.requires_grad
            assert (p.grad - r).abs().max() < 1e-6


@pytest.mark.parametrize("kwargs,match", [
    ({"schedules": "dualpipe", "world_size": 3, "micro_batches": 6, "batch": 12, "blocks": 6}, "world_size=3.*even"),
    ({"schedules": "1f1b", "world_size": 10_000}, "world_size=10000"),
    ({"schedules": "1f1b", "world_size": 1}, "world_size=1"),
    ({"schedules": "1f1b", "micro_batches": 8, "batch": 100}, "micro_batches=8.*divisor of 100"),
    ({"schedules": "1f1b", "blocks": 7}, "blocks=7.*multiple of 2"),
    ({"schedules": "dualpipe", "micro_batches": 2, "batch": 16}, "micro_batches=2"),
    ({"schedules": "interleaved", "micro_batches": 4}, "schedule='interleaved'"),
    ({"schedules": "1f1b", "repeats": 0}, "repeats=0"),
])
def test_bad_input_fails_before_any_process_starts(monkeypatch, kwargs, match):
    import common.parallel.distributed as D
    monkeypatch.setattr(D, "run_workers", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match=match):
        R.run_schedules(**kwargs)


def test_schedules_run_on_two_ranks_with_the_single_process_gradients():
    res = R.run_schedules(("1f1b", "zb1p", "dualpipe"), world_size=2, micro_batches=4, batch=16, blocks=4,
                          hidden=16, repeats=1, timeout=180)
    for name, r in res.items():
        assert r["max_grad_err"] < 1e-5, name
        assert all(i >= 0 for i in r["idle"]) and r["makespan"] > 0
        assert len(r["spans"]) == 2 and len(r["spans"][0]) == len(r["sim"].schedule.ops[0])
    # the first rank's saved activations peak where the simulator says (1F1B: pp micro-batches in flight)
    assert res["1f1b"]["peak_activations"][0] == pytest.approx(2.0)
    assert res["dualpipe"]["peak_activations"][0] == pytest.approx(max(res["dualpipe"]["sim"].peak_activations))
    table = R.compare(res)
    assert list(table.index) == ["1f1b", "zb1p", "dualpipe"]

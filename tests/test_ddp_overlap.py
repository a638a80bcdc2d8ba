"""Bucketed all-reduce overlapped with the backward pass (hooks) and DDP beside it, on 2 gloo ranks."""
import pytest

from common.parallel import ddp_overlap as D


def test_buckets_follow_the_backward_order_and_the_cap():
    import torch
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (4, 4, 4, 8)]   # 16, 16, 16, 32 bytes
    buckets = D.buckets_of(params, 32 / 2**20)
    assert [[p.numel() for p in b] for b in buckets] == [[8], [4, 4], [4]]  # last parameter first
    assert [len(b) for b in D.buckets_of(params, 1)] == [4]
    assert [len(b) for b in D.buckets_of(params, 1e-9)] == [1, 1, 1, 1]  # a tensor larger than the cap: alone


@pytest.mark.parametrize("kwargs,match", [({"world_size": 1}, "world_size=1"), ({"world_size": 10_000}, "world_size=10000"),
                                          ({"bucket_mb": 0}, "bucket_mb=0"), ({"hidden": 0}, "hidden=0")])
def test_bad_input_before_any_process(monkeypatch, kwargs, match):
    import common.parallel.distributed as dist
    monkeypatch.setattr(dist, "run_workers", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match=match):
        D.measure_ddp_overlap(**kwargs)


def test_overlapped_and_ddp_gradients_equal_the_serial_ones():
    t = D.measure_ddp_overlap(2, layers=3, hidden=32, batch=8, bucket_mb=0.005, repeats=2, timeout=180)
    assert t["grad_err"] < 1e-6 and t["ddp_grad_err"] < 1e-6
    assert t["buckets"] >= 2
    for k in ("compute_s", "comm_s", "serial_s", "overlap_s", "ddp_s"):
        assert t[k] > 0
    assert t["sum_s"] == pytest.approx(t["compute_s"] + t["comm_s"])
    assert 1.0 <= t["ideal"] <= 2.0
    assert t["speedup"] == pytest.approx(t["sum_s"] / t["overlap_s"])

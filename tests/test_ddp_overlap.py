"""Bucketed all-reduce overlapped with the backward pass (hooks) and DDP beside it: the fair baseline (launch every
bucket, then wait), DDP against its own compute and comm, figures above their ideal flagged, gradients unchanged."""
import datetime

import pytest
import torch
import torch.distributed as dist

from common.parallel import ddp_overlap as D


def test_buckets_follow_the_backward_order_and_the_cap():
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (4, 4, 4, 8)]   # 16, 16, 16, 32 bytes
    buckets = D.buckets_of(params, 32 / 2**20)
    assert [[p.numel() for p in b] for b in buckets] == [[8], [4, 4], [4]]  # last parameter first
    assert [len(b) for b in D.buckets_of(params, 1)] == [4]
    assert [len(b) for b in D.buckets_of(params, 1e-9)] == [1, 1, 1, 1]  # a tensor larger than the cap: alone


@pytest.mark.parametrize("kwargs,match", [({"world_size": 1}, "world_size=1"),
                                          ({"world_size": 10_000}, "world_size=10000"),
                                          ({"bucket_mb": 0}, "bucket_mb=0"), ({"hidden": 0}, "hidden=0")])
def test_bad_input_before_any_process(monkeypatch, kwargs, match):
    import common.parallel.distributed as dist_mod
    monkeypatch.setattr(dist_mod, "run_workers", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match=match):
        D.measure_ddp_overlap(**kwargs)


@pytest.fixture
def one_rank_group():
    """A process group of this process alone (gloo), for checking which calls a step makes, in which order."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def _calls(monkeypatch, fn) -> list:
    """The all-reduce launches ("launch") and waits ("wait") `fn` makes, in order."""
    seen, real = [], dist.all_reduce

    class Recorded:
        def __init__(self, work):
            self.work = work

        def wait(self):
            seen.append("wait")
            return self.work.wait()

    def all_reduce(t, *a, **k):
        seen.append("launch")
        work = real(t, *a, **k)
        return Recorded(work) if k.get("async_op") else work
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    fn()
    monkeypatch.setattr(dist, "all_reduce", real)
    return seen


def _launches_every_bucket_before_waiting(calls: list, buckets: int) -> None:
    assert calls == ["launch"] * buckets + ["wait"] * buckets, f"not launch-all-then-wait: {calls}"


def test_the_comm_baseline_launches_every_bucket_then_waits(monkeypatch, one_rank_group):
    model = D.make_mlp(3, 16)
    reducer = D.BucketedAllReduce(list(model.parameters()), 16 * 17 * 4 / 2**20)  # one layer per bucket
    ((model(torch.randn(4, 16)) ** 2).mean()).backward()
    n = len(reducer.buckets)
    assert n == 3
    _launches_every_bucket_before_waiting(_calls(monkeypatch, reducer.all_then_wait), n)
    # the overlapped step launches from the hooks during the backward, then waits for all: the same calls
    reducer.arm()
    overlapped = _calls(monkeypatch, lambda: (((model(torch.randn(4, 16)) ** 2).mean()).backward(),
                                               reducer.finish()))
    _launches_every_bucket_before_waiting(overlapped, n)
    # the unfair baseline (each bucket waited for before the next) fails the check
    with pytest.raises(AssertionError, match="not launch-all-then-wait"):
        _launches_every_bucket_before_waiting(_calls(monkeypatch, reducer.each_then_next), n)


def _rank(**t):
    base = {k: 0.01 for k in D.VARIANTS}
    return {**base, **t, "grad_err": 0.0, "ddp_grad_err": 0.0, "buckets": 3, "ddp_buckets": 2, "grad_mb": 1.0}


def test_ddp_against_its_own_compute_and_comm_and_the_ideal_flagged():
    d = D.summarize([_rank(compute_s=0.010, comm_s=0.006, comm_each_s=0.009, overlap_s=0.012,
                           ddp_compute_s=0.008, ddp_comm_s=0.002, ddp_s=0.009)])
    assert d["speedup"] == pytest.approx(0.016 / 0.012) and d["ideal"] == pytest.approx(1.6)
    assert d["ddp_speedup"] == pytest.approx(0.010 / 0.009) and d["ddp_ideal"] == pytest.approx(1.25)
    assert d["speedup_each"] == pytest.approx(0.019 / 0.012)  # the unfair baseline, shown beside: a higher figure
    assert d["above_ideal"] == {} and D.flagged(d) == []
    fast = D.summarize([_rank(compute_s=0.010, comm_s=0.006, overlap_s=0.0095, ddp_compute_s=0.008,
                              ddp_comm_s=0.002, ddp_s=0.0075)])
    assert set(fast["above_ideal"]) >= {"speedup", "ddp_speedup"}
    lines = D.flagged(fast)
    assert any(line.startswith("FLAG speedup 1.68x is above its ideal 1.60x") for line in lines)
    assert any(line.startswith("FLAG ddp_speedup 1.33x is above its ideal 1.25x") for line in lines)
    # the slowest rank's medians decide
    two = D.summarize([_rank(compute_s=0.010), _rank(compute_s=0.020)])
    assert two["compute_s"] == 0.020


def test_overlapped_and_ddp_gradients_equal_the_serial_ones():
    t = D.measure_ddp_overlap(2, layers=3, hidden=32, batch=8, bucket_mb=0.005, repeats=2, timeout=180)
    assert t["grad_err"] < 1e-6 and t["ddp_grad_err"] < 1e-6
    assert t["buckets"] >= 2 and t["ddp_buckets"] >= 2  # DDP re-bucketed after its first step
    assert all(t[k] > 0 for k in D.VARIANTS)

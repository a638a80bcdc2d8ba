"""Bucketed all-reduce overlapped with the backward pass (hooks) and DDP beside it: the fair baseline (launch every
bucket, then wait), DDP against its own compute and comm, figures above their ideal flagged, gradients unchanged."""
import datetime

import pytest
import torch
import torch.distributed as dist

from common.parallel import ddp_overlap as D


def test_buckets_follow_ddps_rule():
    """Backward order (the last parameter first), a bucket closed once it holds the cap or more: DDP's rule, as
    torch's own assignment (which DDP's reducer calls when it re-buckets) makes it."""
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (4, 4, 4, 8)]   # 16, 16, 16, 32 bytes
    buckets = D.buckets_of(params, 32 / 2**20)
    assert [[p.numel() for p in b] for b in buckets] == [[8], [4, 4], [4]]  # last parameter first
    assert [len(b) for b in D.buckets_of(params, 1)] == [4]
    assert [len(b) for b in D.buckets_of(params, 1e-9)] == [1, 1, 1, 1]  # a tensor larger than the cap: alone
    assert [[p.numel() for p in b] for b in D.buckets_of(params, 20 / 2**20)] == [[8], [4, 4], [4]]  # passes the cap
    for cap_mb in (2.0, 1.0, 0.5, 3.0):
        model = D.make_mlp(8, 512)
        ps = list(model.parameters())
        order = list(reversed(ps))
        torch_groups, _ = dist._compute_bucket_assignment_by_size(order, [int(cap_mb * 2**20)])
        assert [[id(order[i]) for i in g] for g in torch_groups] == [[id(p) for p in b] for b in
                                                                    D.buckets_of(ps, cap_mb)], cap_mb


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


def _rank(runs):
    base = {k: 0.01 for k in D.VARIANTS}
    return {"runs": [{**base, **t} for t in runs], "grad_err": 0.0, "ddp_grad_err": 0.0, "same_buckets": True,
            "buckets": [2**20] * 3, "ddp_buckets": [2**20] * 3, "grad_mb": 3.0}


def test_the_baseline_is_the_faster_comm_and_the_ideal_leaves_out_forward_and_last_bucket():
    t = dict(forward_s=0.002, compute_s=0.010, comm_all_s=0.009, comm_each_s=0.006, last_s=0.001, overlap_s=0.012,
             ddp_forward_s=0.002, ddp_compute_s=0.008, ddp_comm_all_s=0.002, ddp_comm_each_s=0.003, ddp_s=0.009)
    d = D.summarize([_rank([t])], ranks_here=2, cores=8)
    assert d["comm_s"] == 0.006 and d["ddp_comm_s"] == 0.002  # the faster of launch-all and one-at-a-time
    assert d["speedup"] == pytest.approx(0.016 / 0.012)
    # forward 2 + max(backward 8, comm 6 - last 1) + last 1 = 11: the naive (compute + comm) / max = 1.6 is wrong
    assert d["ideal"] == pytest.approx(0.016 / 0.011)
    assert d["ddp_ideal"] == pytest.approx(0.010 / (0.002 + 0.006 + 0.001))
    assert d["above_ideal"] == {} and D.flagged(d) == [] and not d["shared_cores"]


def test_medians_over_runs_with_their_spread_the_slowest_rank_and_flags():
    runs = [dict(compute_s=0.010, comm_all_s=0.004, overlap_s=s) for s in (0.013, 0.011, 0.012, 0.014, 0.0102)]
    d = D.summarize([_rank(runs), _rank([{**r, "compute_s": 0.009} for r in runs])], cores=2)
    assert d["runs"] == 5 and d["compute_s"] == 0.010  # the slowest rank's
    speedups = sorted(0.014 / s for s in (0.013, 0.011, 0.012, 0.014, 0.0102))
    assert d["speedup"] == pytest.approx(speedups[2]) and d["spread"]["speedup"] == pytest.approx(
        (speedups[0], speedups[-1]))
    assert d["shared_cores"] and any("take turns on the same cores" in line for line in D.lines(d))
    fast = D.summarize([_rank([dict(compute_s=0.010, comm_all_s=0.006, overlap_s=0.009)])])
    assert "speedup" in fast["above_ideal"]
    assert D.flagged(fast)[0].startswith(f"FLAG speedup {0.016 / 0.009:.2f}x is above its ideal")


def test_overlapped_and_ddp_gradients_equal_the_serial_ones():
    t = D.measure_ddp_overlap(2, layers=3, hidden=32, batch=8, bucket_mb=0.005, repeats=2, runs=2, timeout=180)
    assert t["grad_err"] < 1e-6 and t["ddp_grad_err"] < 1e-6
    assert len(t["buckets"]) >= 2 and t["buckets"] == t["ddp_buckets"] and t["same_buckets"]  # DDP's own buckets
    assert all(t[k] > 0 for k in D.VARIANTS) and t["runs"] == 2

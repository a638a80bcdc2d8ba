"""Pipeline schedules executed on ranks: the gradients of one process, op spans without receive waits, activation
bytes really alive, bad input refused before a process starts. Most tests run the ranks as threads of this process
(`threaded_pipeline`), so that a deliberately broken piece of the executor can be put in and seen to fail."""
import time

import pytest
import threaded_pipeline as T
import torch

from common.parallel import pipeline
from common.parallel import pipeline_run as R
from common.parallel.pipeline_run import plan
from common.parallel.rendezvous import Hang


def test_zero_bubble_split_gives_the_full_backward():
    """Bi (input gradients, weight parts queued) then W gives the same gradients as one full backward."""
    params = [[t.clone().requires_grad_() for t in blk] for blk in R.make_model(2, 8)]
    x, t = R.make_batch(4, 8)
    store = R.WeightGradStore()
    store.deferring = ("Bi", 0, 0)
    R.loss_of(R.stage_forward(params, x, store), t, 4).backward()
    store.deferring = None
    assert all(p.grad is None for blk in params for p in blk)  # the weights waited for W
    store.run(("Bi", 0, 0))
    for blk, rb in zip(params, R.reference_gradients(2, 8, 4)):
        for p, r in zip(blk, rb):
            assert not p.grad.requires_grad and (p.grad - r).abs().max() < 1e-6


@pytest.mark.parametrize("kwargs,match", [
    ({"schedules": "dualpipe", "world_size": 3, "micro_batches": 6, "batch": 12, "blocks": 6}, "world_size=3.*even"),
    ({"schedules": "1f1b", "world_size": 10_000}, "world_size=10000"),
    ({"schedules": "1f1b", "world_size": 1}, "world_size=1"),
    ({"schedules": "1f1b", "micro_batches": 8, "batch": 100}, "micro_batches=8.*divisor of 100"),
    ({"schedules": "1f1b", "blocks": 7}, "blocks=7.*multiple of 2"),
    ({"schedules": "dualpipe", "micro_batches": 2, "batch": 16}, "micro_batches=2"),
    ({"schedules": "interleaved", "micro_batches": 3, "batch": 12}, "micro_batches=3.*multiple of pp = 2"),
    ({"schedules": "gpipe_x"}, "schedule='gpipe_x'"),
    ({"schedules": "1f1b", "repeats": 0}, "repeats=0"),
    ({"schedules": "1f1b", "backend": "mpi"}, "backend='mpi' is not supported"),
    ({"schedules": "1f1b", "backend": "nccl"}, "backend='nccl' needs CUDA GPUs"),
])
def test_bad_input_fails_before_any_process_starts(monkeypatch, kwargs, match):
    import common.parallel.distributed as D
    monkeypatch.setenv("WORKBOOK_FORCE_CPU", "1")  # as on a CPU-only machine, where NCCL cannot run
    monkeypatch.setattr(D, "run_workers", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match=match):
        R.run_schedules(**kwargs)


def _waits_not_in_spans(ranks: list) -> None:
    """Each rank's spans and its receive waits are disjoint parts of its step: busy + waits <= step time."""
    for r, rec in enumerate(ranks):
        busy = sum(e - s for s, e, _ in rec["spans"])
        assert busy + rec["recv_wait"] <= rec["end"] * 1.001 + 1e-4, \
            f"rank {r}: busy {busy:.4f} s + receive waits {rec['recv_wait']:.4f} s > step {rec['end']:.4f} s"


class _WaitInsideTheOp(R.PointToPoint):
    """A broken executor: the receives are waited for when the op takes its input, inside its span, so a wait for a
    peer counts as work."""

    def wait(self, k):
        pass

    def take(self, key):
        super().wait(len(self.plan.batches))
        return super().take(key)


@pytest.mark.parametrize("name", ["1f1b", "dualpipe"])
def test_spans_exclude_receive_waits(monkeypatch, name):
    run = T.run(name, 2, 4 if name == "1f1b" else 8, batch=32, hidden=16, delay=0.01)  # every receive 10 ms late
    assert all(rec["recv_wait"] > 0.01 for rec in run["ranks"])
    _waits_not_in_spans(run["ranks"])
    monkeypatch.setattr(T.R, "PointToPoint", _WaitInsideTheOp)
    broken = T.run(name, 2, 4 if name == "1f1b" else 8, batch=32, hidden=16, delay=0.01)
    with pytest.raises(AssertionError, match="receive waits"):
        _waits_not_in_spans(broken["ranks"])


def _expected_live_units(schedule, rank: int) -> float:
    """The peak, in micro-batch x stage units, of what must be alive on `rank`: a forward keeps its activations
    (1 unit) until its backward; a full B frees them; a Bi frees them but leaves the weight pass its layer inputs
    and output gradients (2 units) until W. (The simulator frees at Bi: the README's count, not memory.)"""
    now = peak = 0
    for op in schedule.ops[rank]:
        for kind, *_ in op:
            now += {"F": 1, "B": -1, "Bi": 1, "W": -2}[kind]
            peak = max(peak, now)
    return peak


def _live_bytes_are_real(run) -> None:
    for r, rec in enumerate(run["ranks"]):
        units = rec["peak_bytes"] / rec["stage_bytes"]
        expected = _expected_live_units(run["schedule"], r)
        assert units == pytest.approx(expected), f"rank {r}: {units} units of activations alive, expected {expected}"


class _CountingStage(R.Stage):
    """A broken record: counts a micro-batch's activations from its forward until its Bi or B (the simulator's
    rule, which the old executor's byte count followed), instead of measuring what is alive."""

    def run(self, item, received=None):
        out = super().run(item, received)
        self.count = getattr(self, "count", 0) + {"F": 1, "B": -1, "Bi": -1, "W": 0}[item[0]]
        self.live.peak = max(getattr(self, "peak_seen", 0), self.count * self.stage_bytes())
        self.peak_seen = self.live.peak
        return out


@pytest.mark.parametrize("pp", [2, 4])
def test_activation_bytes_are_the_live_ones(monkeypatch, pp):
    for name in ("gpipe", "1f1b", "zb1p", "dualpipe", "dualpipev"):
        run = T.run(name, pp, 8, batch=64, blocks=2 * pp, hidden=16)
        _live_bytes_are_real(run)
        sim = pipeline.simulate(run["schedule"]).peak_activations
        frac = run["schedule"].stage_fraction
        measured = [frac * rec["peak_bytes"] / rec["stage_bytes"] for rec in run["ranks"]]
        if name in ("gpipe", "1f1b"):  # no weight pass: the simulator's count is the memory
            assert measured == pytest.approx(sim)
        if name == "zb1p":  # the pending weight passes hold memory the simulator does not count
            assert all(m > s for m, s in zip(measured, sim))
    monkeypatch.setattr(T.R, "Stage", _CountingStage)
    with pytest.raises(AssertionError, match="units of activations alive"):
        _live_bytes_are_real(T.run("zb1p", pp, 8, batch=64, blocks=2 * pp, hidden=16))


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb1p", "dualpipev", "dualpipe", "interleaved"])
def test_every_schedule_runs_under_nccl_rules(name, pp):
    """Under NCCL's rules (a send waits for its receive, a batch is one work, one stream per rank; gloo and the
    buffered wire hide them) every schedule completes at pp = 2, 4 and 8 with one process's gradients. A hang fails
    after 10 s, naming what each rank waits for."""
    if name not in R.RUNNABLE:
        pytest.fail(f"schedule {name!r} cannot run on ranks")
    run = T.run(name, pp, 2 * pp, batch=8 * pp, blocks=4 * pp, hidden=8, wire="nccl", timeout=10)
    assert run["grad_err"] < 1e-4


_make = plan.make


def _late_receives(schedule, durations=None) -> list:
    """The plans of the executor before this one: each receive posted in the batch of the op that needs it (and
    the batch waited for whole, as NCCL returns one work per batch)."""
    plans = _make(schedule)
    for p in plans:
        for _, recvs in p.batches:
            recvs.clear()
        for k, op in enumerate(p.ops):
            needs = [n for n in (plan.inputs_of(schedule, item) for item in op) if n and n[0] != p.rank]
            p.batches[k][1].extend(needs)
            p.waits[k] = [k] if needs else []
    return plans


def test_receives_posted_late_deadlock_under_nccl_rules(monkeypatch):
    """The old executor's plan -- a receive posted only when the op that needs it is next -- deadlocks DualPipe under
    NCCL's rules: the plan check says so before any process starts, and the rendezvous transport hangs on it."""
    sched = pipeline.build("dualpipe", 4, 8)
    with pytest.raises(pipeline.Deadlock, match="wait on each other forever"):
        plan.check(_late_receives(sched))
    monkeypatch.setattr(plan, "make", _late_receives)
    with pytest.raises(Hang, match=r"rank \d: its batch waits to send \('act', 1, 2, 1\) to rank 0 \(peer has posted no match\)"):
        T.run("dualpipe", 4, 8, batch=32, blocks=4, hidden=8, wire="nccl", timeout=2)


def test_the_step_updates_every_copy_as_one_process_would(monkeypatch):
    """DualPipe holds every stage twice (rank r: stage r of one direction, pp-1-r of the other): after the step both
    copies hold the full gradient (summed with the mirror rank) and the same weights, one SGD step from one
    process's. Without the mirrors' all-reduce, each copy has only its own direction's half."""
    run = T.run("dualpipe", 4, 8, batch=32, blocks=8, hidden=16, wire="nccl", lr=0.5)
    assert run["copy_grad_err"] < 1e-5 and run["weight_err"] < 1e-5
    d0 = {(s, i): blk for st in run["stages"] for d, s, i, blk in st.copies() if d == 0}
    d1 = {(s, i): blk for st in run["stages"] for d, s, i, blk in st.copies() if d == 1}
    assert d0.keys() == d1.keys() and all(torch.equal(a, b) for k in d0 for a, b in zip(d0[k], d1[k]))
    one_way = _make(pipeline.build("dualpipe", 4, 8))
    for p in one_way:
        p.mirror = None  # a broken plan: no all-reduce with the mirror rank
    monkeypatch.setattr(plan, "make", lambda schedule, durations=None: one_way)
    half = T.run("dualpipe", 4, 8, batch=32, blocks=8, hidden=16, wire="nccl", lr=0.5)
    assert half["copy_grad_err"] > 1e-3 and half["weight_err"] > 1e-3


def test_four_real_ranks_ours_and_torchs_engine():
    """On 4 gloo processes, in one group: 1F1B, ZB1P, DualPipe (its warm-up and zero-bubble phases run at pp = 4) and
    DualPipeV give the single-process gradients and weights; spans and receive waits are disjoint; the bytes are the
    live ones. And the same model under torch.distributed.pipelining (Schedule1F1B, ScheduleDualPipeV) gives the same
    loss and gradients as ours and as one process."""
    from common.parallel.distributed import run_workers, start_rank_server, tasks_worker
    names = ("1f1b", "zb1p", "dualpipe", "dualpipev")
    ours = R.pipeline_task(names, 4, 8, 32, 8, 16, 1)
    theirs = R.engines_task(("1f1b", "dualpipev"), 4, 8, 32, 8, 16, 1)
    start_rank_server(*R.torch_engine.RANK_MODULES)
    per_rank = run_workers(tasks_worker, 4, args=([ours, theirs],), backend="gloo", timeout=240)
    res = R.summarize_all([r[0] for r in per_rank], 4, 8)
    for name, r in res.items():
        assert r["max_grad_err"] < 1e-5 and r["max_weight_err"] < 1e-5, name
        assert all(b + w <= r["makespan"] * 1.001 + 1e-4 for b, w in zip(r["busy"], r["recv_wait"])), name
        sched = r["sim"].schedule
        frac = sched.stage_fraction
        expected = [frac * _expected_live_units(sched, rank) for rank in range(4)]
        assert r["peak_activations"] == pytest.approx(expected), name
        assert sum(len(s) for s in r["spans"]) == sum(len(ops) for ops in sched.ops)
    assert list(R.compare(res).index) == list(names)
    assert R.ledger_names(4) == {"grad_max_err": "pp.real.pp4.grad_max_err", "bubble_ratio": "pp.real.pp4.bubble_ratio"}
    assert R.ledger_names(2)["bubble_ratio"] == "pp.real.bubble_ratio"
    engines = [r[1] for r in per_rank]
    assert R.grad_max_err(engines) < 1e-4
    for name, e in engines[0].items():
        assert e["blocks_compared"] == 8 and e["ours_vs_one"] < 1e-5, name
        assert e["torch_loss"] == pytest.approx(e["one_loss"], rel=1e-5) == e["our_loss"], name
    assert list(R.table(engines).index) == ["1f1b", "dualpipev"]


def test_a_schedule_built_elsewhere_is_checked_before_any_process_starts(monkeypatch):
    """A learner's schedule (a pipeline.Schedule) runs like a named one; one that does not fit the run, is incomplete
    or deadlocks is refused before a process starts."""
    import common.parallel.distributed as D
    monkeypatch.setattr(D, "run_workers", lambda *a, **k: pytest.fail("a process was started"))
    good = pipeline.build("1f1b", 2, 8)
    worker, args = R.pipeline_task((good, "gpipe"), 2, 8, 32, 4, 16, 1)
    assert args[0] == (good, "gpipe")
    with pytest.raises(ValueError, match=r"has 2 ranks and 8 micro-batches; the run has world_size=4"):
        R.run_schedules((good,), world_size=4, micro_batches=8, batch=32, blocks=4)
    missing = pipeline.Schedule("yours", 2, 2, 8, 1, dict(good.placement), [good.ops[0], good.ops[1][:-1]])
    with pytest.raises(ValueError, match=r"is missing"):
        R.run_schedules((missing,), world_size=2, micro_batches=8, batch=32, blocks=4)
    stuck = pipeline.Schedule("yours", 2, 2, 8, 1, dict(good.placement), [good.ops[0], good.ops[1][::-1]])
    with pytest.raises(pipeline.Deadlock):
        R.run_schedules((stuck,), world_size=2, micro_batches=8, batch=32, blocks=4)


def test_torchs_engine_refuses_what_it_does_not_have(monkeypatch):
    import common.parallel.distributed as D
    monkeypatch.setattr(D, "run_workers", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match="schedules: 'zb1p' has no torch.distributed.pipelining schedule here"):
        R.run_engines(("zb1p",))

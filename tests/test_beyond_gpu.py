"""Lab 11's modules: kvcache, hostside, memory, sharing."""
import os

import pytest
import torch

from common.facts.models import load_model_config
from common.systems.host import hostside, memory, sharing
from common.systems.inference import kvcache


def test_deepseek_v3_mla_is_576_values_per_layer():
    kv = kvcache.deepseek_v3_kv(load_model_config("deepseek_v3").values)
    assert kv["mla"] == 61 * 576 * 2 == 70_272
    assert kv["mha_equivalent"] == 61 * 128 * (192 + 128) * 2
    assert kv["mha_paper_convention"] == 61 * 2 * 128 * 128 * 2


def test_kv_formulas_and_errors():
    assert kvcache.kv_bytes_per_token(32, 8, 128, 128, 2) == 32 * 8 * 256 * 2
    with pytest.raises(ValueError, match="kv_heads=0"):
        kvcache.kv_bytes_per_token(32, 0, 128, 128, 2)
    assert kvcache.sequences_that_fit(1e9, 1e5, 100) == 100
    assert kvcache.paged_waste([16, 17, 1], 16) == 0 + 15 + 15


def test_allocation_paged_fits_more():
    cont, paged = kvcache.simulate_allocation([100, 200, 300, 50] * 10, max_len=512, block_size=16,
                                              capacity_tokens=8192)
    assert cont.policy == "contiguous" and cont.sequences == 16
    assert paged.sequences > cont.sequences and paged.waste_fraction < 0.1 < cont.waste_fraction
    with pytest.raises(ValueError, match="1..max_len"):
        kvcache.simulate_allocation([600], 512, 16, 8192)


def test_predicted_idle():
    assert hostside.predicted_idle_fraction(0, 8, 8) == 0.5
    assert hostside.predicted_idle_fraction(1, 8, 8) == 0.0
    assert hostside.predicted_idle_fraction(1, 16, 8) == 0.5
    # the hand-off: worker-bound runs hide it, consumer-bound runs idle for it
    assert hostside.predicted_idle_fraction(1, 16, 8, handoff_ms=2) == 0.5
    assert hostside.predicted_idle_fraction(4, 16, 8, handoff_ms=2) == pytest.approx(0.2)
    assert hostside.predicted_idle_fraction(0, 8, 8, handoff_ms=2) == 0.5
    with pytest.raises(ValueError, match="step_ms=0"):
        hostside.predicted_idle_fraction(1, 8, 0)
    with pytest.raises(ValueError, match="handoff_ms=-1"):
        hostside.predicted_idle_fraction(1, 8, 8, handoff_ms=-1)


@pytest.mark.notebooks
def test_loader_workers_reduce_idle():
    rows = hostside.loader_idle_sweep(workers=(0, 2), n_items=48, batch_size=4, item_ms=3, step_ms=12)
    assert rows[0]["batches"] == rows[1]["batches"] == 12
    # the steady state: the whole run's idle fraction also holds the workers' start-up (a fork and imports, which on
    # a loaded machine can outlast this short run), the thing the comparison is not about
    assert rows[0]["steady_idle_fraction"] > 0.3
    assert rows[1]["steady_idle_fraction"] < rows[0]["steady_idle_fraction"]
    # each run measures its own model inputs while it runs: the load time of a batch (its items' own times, in the
    # process that made them) and the real step, both at least what was asked for
    for row in rows:
        assert 4 * 3 <= row["load_ms"] < 4 * 3 * 5 and row["load_spread"] >= 0
        assert 12 <= row["step_ms"] < 12 * 5
        assert 0 <= row["handoff_ms"] < 200


@pytest.mark.notebooks
def test_model_inputs_are_measured():
    assert 4 * 3 <= hostside.batch_cost_ms(batch_size=4, item_ms=3, n_batches=4) < 4 * 3 * 5
    assert 0 <= hostside.handoff_ms(5.0, n_batches=8) < 50
    with pytest.raises(ValueError, match="n_batches=2"):
        hostside.handoff_ms(5.0, n_batches=2)


def test_h2d_model():
    assert hostside.h2d_copy_seconds(1e9, 50, 10, pinned=True) == pytest.approx(0.02)
    assert hostside.h2d_copy_seconds(1e9, 50, 10, pinned=False) == pytest.approx(0.12)
    with pytest.raises(ValueError):
        hostside.h2d_copy_seconds(1e9, 0, 10, True)


def test_topology_reads():
    nodes = hostside.numa_topology()
    assert nodes and "cpus" in nodes[0]
    assert isinstance(hostside.gpu_numa_nodes(), list)


def test_affinity_probe_and_errors():
    cpus = sorted(os.sched_getaffinity(0))
    assert hostside.matmul_gflops_pinned({cpus[0]}, 1, n=128, repeats=3) > 0
    with pytest.raises(ValueError, match="subset"):
        hostside.matmul_gflops_pinned({10_000}, 1)


def test_caching_allocator_fragmentation():
    MiB = 1 << 20
    a = memory.CachingAllocatorModel()
    hs = [a.malloc(3 * MiB) for _ in range(6)]  # one 20 MiB segment (kLargeBuffer), carved 6 x 3 MiB + 2 MiB
    assert a.stats()["reserved"] == 20 * MiB and a.stats()["allocated"] == 18 * MiB
    for h in hs[::2]:
        a.free(h)
    s = a.stats()
    assert s["reserved"] == 20 * MiB and s["allocated"] == 9 * MiB and s["largest_free_block"] == 3 * MiB
    a.malloc(6 * MiB)  # 11 MiB free in the segment, no block of 6 MiB: a second 20 MiB segment
    assert a.stats()["reserved"] == 40 * MiB and a.stats()["allocated"] == 15 * MiB
    small = a.malloc(1000)  # small pool: rounded to 1024 B, a 2 MiB segment
    assert a.stats()["reserved"] == 42 * MiB and a.stats()["allocated"] == 15 * MiB + 1024
    a.free(small)
    with pytest.raises(ValueError, match="not a live allocation"):
        a.free(small)
    with pytest.raises(ValueError, match="nbytes"):
        a.malloc(0)


def test_caching_allocator_follows_pytorch_sizes():
    MiB = 1 << 20
    # PyTorch's constants (c10/cuda/CUDACachingAllocator.cpp)
    assert (memory.K_MIN_BLOCK_SIZE, memory.K_SMALL_SIZE, memory.K_SMALL_BUFFER, memory.K_MIN_LARGE_ALLOC,
            memory.K_LARGE_BUFFER, memory.K_ROUND_LARGE) == (512, MiB, 2 * MiB, 10 * MiB, 20 * MiB, 2 * MiB)
    assert [memory.round_size(n) for n in (1, 512, 513, 1000)] == [512, 512, 1024, 1024]
    assert [memory.segment_size(n) for n in (512, MiB, MiB + 512, 10 * MiB - 512, 10 * MiB, 11 * MiB)] == \
        [2 * MiB, 2 * MiB, 20 * MiB, 20 * MiB, 10 * MiB, 12 * MiB]
    # a large request above 10 MiB: its own segment, rounded to 2 MiB; a rest of <= 1 MiB is not split off
    a = memory.CachingAllocatorModel()
    a.malloc(11 * MiB + 100)
    assert a.stats()["reserved"] == 12 * MiB and a.stats()["allocated"] == 12 * MiB
    b = memory.CachingAllocatorModel()
    b.malloc(10 * MiB + 512)  # rest 2 MiB - 512 > 1 MiB: split
    assert b.stats()["reserved"] == 12 * MiB and b.stats()["allocated"] == 10 * MiB + 512
    # best fit reuses a freed block of the same pool; small and large pools never mix
    c = memory.CachingAllocatorModel()
    h = c.malloc(4 * MiB)
    c.free(h)
    c.malloc(2 * MiB)
    assert c.stats()["segments"] == 1
    c.malloc(1000)
    assert c.stats()["segments"] == 2


def test_saved_activation_bytes_and_checkpointing():
    layer = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    x = torch.randn(32, 64, requires_grad=True)
    _, plain = memory.saved_activation_bytes(layer, x)
    from torch.utils.checkpoint import checkpoint
    _, ckpt = memory.saved_activation_bytes(lambda t: checkpoint(layer, t, use_reentrant=False), x)
    assert plain > ckpt > 0


def test_sharing_model():
    assert sharing.shared_utilisation(0.1, 7, "mig") == pytest.approx(0.7)
    assert sharing.shared_utilisation(0.1, 7, "time-slicing") == 0.1
    assert sharing.shared_utilisation(0.3, 5, "mps") == 1.0
    assert len(sharing.mig_profiles("H100-SXM")) == 6
    with pytest.raises(ValueError, match="mode='x'"):
        sharing.shared_utilisation(0.1, 1, "x")
    with pytest.raises(ValueError, match="no MIG profiles"):
        sharing.mig_profiles("B300")
    assert sharing.coupled_step_time(1.0, 0.5, 1 / 7, 2.0) == pytest.approx(8.0)


def test_placement_probes_start_together_and_measure_one_at_a_time():
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("thread affinity needs Linux")
    cpu = min(os.sched_getaffinity(0))
    got = hostside.placement_probes([("one", {cpu}, 1), ("two", {cpu}, 2)], n=128, repeats=3, ops=500)
    assert list(got) == ["one", "two"]
    assert all(set(v) == {"matmul_gflops", "elementwise_wall_us", "elementwise_cpu_us"} for v in got.values())
    # two threads taking turns on one core burn more CPU for the same work (2-3x measured on a loaded 2-core box)
    assert got["two"]["elementwise_cpu_us"] > 1.1 * got["one"]["elementwise_cpu_us"]
    with pytest.raises(ValueError, match="threads=0"):
        hostside.placement_probes([("none", {cpu}, 0)])
    with pytest.raises(ValueError, match="threads=0"):  # named before any process starts
        hostside.placement_probes([("fine", {cpu}, 2), ("none", {cpu}, 0)])
    with pytest.raises(ValueError, match="cpus=\\[100000\\]"):
        hostside.placement_probes([("nowhere", {100_000}, 1)])


def test_one_thread_placements_share_a_process_that_holds_their_cpus(monkeypatch):
    calls = []

    def gated(jobs, timeout=120, turns=None):  # what would run: (cpus, threads) of each process, its turns
        calls.append([(sorted(cpus), threads, n, code) for (code, cpus, threads), n in zip(jobs, turns)])
        return [[[float(k), float(k), float(k)] for k in range(n)] for n in turns]
    monkeypatch.setattr(hostside, "_run_pinned_gated", gated)
    monkeypatch.setattr(hostside.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    got = hostside.placement_probes([("1 on 2", {2}, 1), ("2 on 0-1", {0, 1}, 2), ("1 on 1", {1}, 1),
                                     ("2 on 0", {0}, 2), ("1 on 0", {0}, 1)])
    (procs,) = calls
    # "1 on 1" and "1 on 0" join the first process whose CPUs hold theirs, after its own turn; "1 on 2" has none
    assert [p[:3] for p in procs] == [([2], 1, 1), ([0, 1], 2, 3), ([0], 2, 1)]
    assert "[([0, 1], 2), ([1], 1), ([0], 1)]" in procs[1][3]
    assert list(got) == ["1 on 2", "2 on 0-1", "1 on 1", "2 on 0", "1 on 0"]
    assert [v["matmul_gflops"] for v in got.values()] == [0, 0, 1, 0, 2]  # each its own turn's line


def test_placement_probes_leave_no_process_when_one_fails(monkeypatch):
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("thread affinity needs Linux")
    import subprocess
    started = []
    real_popen = subprocess.Popen

    def popen(*a, **kw):
        p = real_popen(*a, **kw)
        started.append(p)
        return p
    monkeypatch.setattr(subprocess, "Popen", popen)
    cpu = min(os.sched_getaffinity(0))
    with pytest.raises(RuntimeError, match="failed to start .*no torch here"):
        hostside._run_pinned_gated([("print('ready', flush=True); import sys; sys.stdin.readline()", {cpu}, 1),
                                    ("raise SystemExit('no torch here')", {cpu}, 1)], timeout=30)
    with pytest.raises(TimeoutError, match="did not start within timeout=1"):
        hostside._run_pinned_gated([("import time; time.sleep(60)", {cpu}, 1)], timeout=1)
    assert len(started) == 3 and all(p.poll() is not None for p in started)

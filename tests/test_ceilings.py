"""Ceilings, cache sizes, thread control and the machine profile (measured once, saved, reused)."""
import pytest
import torch

from common.core import ceilings
from common.kernels import roofline as rl


def test_cache_sizes_from_sys(tmp_path):
    for i, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
                                             (3, "Unified", "32768K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n"), (d / "type").write_text(kind + "\n"), (d / "size").write_text(size)
    caches = ceilings.cache_sizes(str(tmp_path))
    assert caches == {"L1": 32 * 2**10, "L2": 2**20, "L3": 32 * 2**20}
    sizes = ceilings.hierarchy_sizes(caches)
    assert sizes["L1"] * 2 <= caches["L1"] and sizes["L2"] * 2 <= caches["L2"]
    assert 2 * sizes["DRAM"] >= 3 * caches["L3"], "the DRAM point must be past the last-level cache"


def test_dram_buffer_past_a_huge_llc():
    """A 480 MiB L3 (the machine of the issue) must not hold the DRAM buffer: source and destination together at
    least 3x the LLC, a power of two, and no larger than needed (300 MiB -> 512 MiB, not 1 GiB)."""
    assert ceilings.dram_buffer_bytes({"L3": 480 * 2**20}) == 2**30
    assert ceilings.dram_buffer_bytes({"L3": 300 * 2**20}) == 2**29
    assert ceilings.dram_buffer_bytes({"L3": 8 * 2**20}) == 2**26


def test_threads_restores_and_validates():
    before = torch.get_num_threads()
    with ceilings.threads(1) as n:
        assert n == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match="threads="):
            with ceilings.threads(bad):
                pass


def test_sweep_is_single_threaded_and_says_so():
    c = ceilings.bandwidth_sweep([2**16], device="cpu", min_run_time=0.01)[0]
    assert "1 thread" in c.detail and c.value > 0.1
    assert len(c.timing.times) >= 3


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="nbytes=100"):
        ceilings.measure_copy_bandwidth(100, device="cpu")
    with pytest.raises(ValueError, match="n=8"):
        ceilings.measure_matmul_rate(8, device="cpu")
    with pytest.raises(ValueError, match="device='gpu'"):
        ceilings.measure_copy_bandwidth(2**20, device="gpu")


def test_machine_profile_measured_once(tmp_path, monkeypatch):
    monkeypatch.setattr(ceilings, "MACHINE_DIR", tmp_path)
    monkeypatch.setattr(ceilings, "_cached", {})
    monkeypatch.setattr(ceilings, "dram_buffer_bytes", lambda caches=None, device="cpu": 2**22)
    monkeypatch.setitem(ceilings.MATMUL_N, "cpu", 256)  # the profile's logic, not this machine's speed
    calls = []
    real = ceilings._time_copy  # one timed copy (machine_profile fills its buffers once)

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(ceilings, "_time_copy", counting)
    # one thread and all threads, the better kept, in each of 3 rounds
    per_measure = 3 * len({1, torch.get_num_threads()})
    p1 = ceilings.machine_profile(min_run_time=0.01, rounds=3)
    assert len(calls) == per_measure and (tmp_path / f"{p1.fingerprint}.json").exists()
    assert p1.copy.detail.endswith("of 3 rounds") and p1.matmul.detail.endswith("of 3 rounds")
    monkeypatch.setattr(ceilings, "_cached", {})  # a new process: read from disk, measure nothing
    p2 = ceilings.machine_profile()
    assert len(calls) == per_measure
    assert p2.copy.value == p1.copy.value and p2.matmul.value == p1.matmul.value and p2.threads == p1.threads
    assert rl.Roof.from_profile(p2).ridge == pytest.approx(p1.matmul.value / p1.copy.value)
    ceilings.machine_profile(refresh=True, min_run_time=0.01, rounds=3)
    assert len(calls) == 2 * per_measure
    with pytest.raises(ValueError, match="rounds=0"):
        ceilings.machine_profile(refresh=True, rounds=0)
    assert "copy bandwidth" in p2.summary() and "thread" in p2.summary()


def test_profile_of_fewer_threads_is_measured_again(tmp_path, monkeypatch):
    """A profile saved by a run with fewer threads (OMP_NUM_THREADS=1) is not this process's roof: measure again;
    one saved with as many threads or more is served as it is."""
    monkeypatch.setattr(ceilings, "MACHINE_DIR", tmp_path)
    monkeypatch.setattr(ceilings, "_cached", {})
    monkeypatch.setattr(ceilings, "dram_buffer_bytes", lambda caches=None, device="cpu": 2**22)
    monkeypatch.setitem(ceilings.MATMUL_N, "cpu", 256)
    first = ceilings.machine_profile(min_run_time=0.01, rounds=1)
    calls = []
    real = ceilings._time_copy

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(ceilings, "_time_copy", counting)
    monkeypatch.setattr(ceilings, "_cached", {})
    monkeypatch.setattr(ceilings, "_torch_threads", lambda: first.threads)
    assert ceilings.machine_profile().copy.value == first.copy.value and not calls
    monkeypatch.setattr(ceilings, "_cached", {})
    monkeypatch.setattr(ceilings, "_torch_threads", lambda: first.threads + 1)
    ceilings.machine_profile(min_run_time=0.01, rounds=1)
    assert calls, "a profile measured with fewer threads than this process has was served as this machine's roof"


def test_fingerprint_is_stable():
    assert ceilings.fingerprint() == ceilings.fingerprint()
    assert ceilings.fingerprint().startswith("cpu-")


def test_keep_best_never_lowers_a_ceiling(tmp_path, monkeypatch):
    monkeypatch.setattr(ceilings, "MACHINE_DIR", tmp_path)
    monkeypatch.setattr(ceilings, "_cached", {})
    monkeypatch.setattr(ceilings, "dram_buffer_bytes", lambda caches=None, device="cpu": 2**22)
    monkeypatch.setitem(ceilings.MATMUL_N, "cpu", 256)  # the profile's logic, not this machine's speed
    first = ceilings.machine_profile(min_run_time=0.01, rounds=2)
    first.copy.value *= 100  # pretend a quiet machine once measured far more
    import json
    ceilings.profile_path(first.fingerprint).write_text(json.dumps(first.to_json()))
    again = ceilings.machine_profile(refresh=True, keep_best=True, min_run_time=0.01, rounds=2)
    assert again.copy.value == first.copy.value
    reset = ceilings.machine_profile(refresh=True, min_run_time=0.01, rounds=2)
    assert reset.copy.value < first.copy.value


def test_raise_to_keeps_the_best_demonstrated_rate(tmp_path, monkeypatch):
    monkeypatch.setattr(ceilings, "MACHINE_DIR", tmp_path)
    monkeypatch.setattr(ceilings, "_cached", {})
    monkeypatch.setattr(ceilings, "dram_buffer_bytes", lambda caches=None, device="cpu": 2**22)
    monkeypatch.setitem(ceilings.MATMUL_N, "cpu", 256)  # the profile's logic, not this machine's speed
    prof = ceilings.machine_profile(min_run_time=0.01, rounds=2)
    same, lines = ceilings.raise_to(prof, matmul_gflops=prof.matmul.value / 2, source="a slow kernel")
    assert same is prof and lines == []
    up, lines = ceilings.raise_to(prof, matmul_gflops=prof.matmul.value * 3, source="lab 02's GEMM")
    assert up.matmul.value == prof.matmul.value * 3 and up.copy.value == prof.copy.value
    assert len(lines) == 1 and "lab 02's GEMM" in lines[0] and "lab 02's GEMM" in up.matmul.detail
    assert ceilings.machine_profile().matmul.value == up.matmul.value  # saved and served to later labs
    with pytest.raises(ValueError, match="copy rate"):
        ceilings.raise_to(prof, copy_gbps=0.0)

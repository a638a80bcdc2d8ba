"""Lab 11's storage section: the scratch directory (budget, clean-up, unwritable directory, full disk), reads from
the page cache and the device, time-based samples and random reads, checkpoints (written durably, by a background
thread, DCP async on gloo ranks) and 3FS's scale."""
import errno
import math
import os
import stat
import subprocess
import time

import pytest
import torch

from common.facts import models
from common.systems import storage
from common.systems.inference import kvcache
from common.systems.v3 import model as v3model
from common.systems.storage import files as _files  # noqa: F401  (storage.files for monkeypatching)
from common.systems.storage import KIB, MIB, StorageError


@pytest.fixture
def scratch(tmp_path):
    with storage.scratch_dir(64 * MIB, root=tmp_path / "root") as s:
        yield s


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory this process cannot write: mode 0555, and for root (who ignores modes) the immutable flag."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    immutable = False
    try:
        (d / "probe").touch()
    except OSError:
        pass
    else:  # root: the mode does not stop us
        (d / "probe").unlink()
        immutable = subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0
        if not immutable:
            d.chmod(0o755)
            pytest.skip("running as root without chattr: no way to make a directory read-only here")
    yield d
    if immutable:
        subprocess.run(["chattr", "-i", str(d)], check=True)
    d.chmod(0o755)


# ---------------------------------------------------------------- the scratch directory

def test_scratch_dir_is_removed_at_the_end_and_on_failure(tmp_path):
    root = tmp_path / "build" / "storage"
    with storage.scratch_dir(8 * MIB, root=root) as s:
        assert s.path.parent == root and s.path.is_dir()
        storage.write_file(s / "a.bin", MIB)
    assert not s.path.exists() and not root.exists(), "the folders scratch_dir made must go too"
    with pytest.raises(KeyError):
        with storage.scratch_dir(8 * MIB, root=root) as s:
            storage.write_file(s / "a.bin", MIB)
            raise KeyError("a cell failing half-way")
    assert not root.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "learner.txt").write_text("mine")
    with storage.scratch_dir(MIB, root=kept):
        pass
    assert [p.name for p in kept.iterdir()] == ["learner.txt"], "nothing else in the directory may be touched"


def test_scratch_default_root_is_under_build():
    assert storage.DEFAULT_ROOT.parent.name == "build"
    assert storage.MAX_SCRATCH_BYTES == 1 << 30


@pytest.mark.parametrize("bad", [0, -1, (1 << 30) + 1, 1.5, True, "1"])
def test_scratch_budget_validated(bad, tmp_path):
    with pytest.raises(ValueError, match="budget_bytes"):
        with storage.scratch_dir(bad, root=tmp_path):
            pass


def test_reserve_refuses_more_than_the_budget(scratch):
    scratch.reserve(60 * MIB, "a file")
    with pytest.raises(ValueError, match="over its budget of 64 MiB"):
        scratch.reserve(8 * MIB, "another file")


def test_read_only_directory_is_a_clear_error_and_leaves_nothing(read_only_dir):
    with pytest.raises(StorageError, match=f"cannot write in directory '{read_only_dir}'"):
        with storage.scratch_dir(MIB, root=read_only_dir):
            pass
    deeper = read_only_dir / "build" / "storage"
    with pytest.raises(StorageError, match="cannot write in directory .*ro/build/storage"):
        with storage.scratch_dir(MIB, root=deeper):
            pass
    assert list(read_only_dir.iterdir()) == []


def test_full_disk_before_writing_is_a_clear_error(tmp_path, monkeypatch):
    root = tmp_path / "root"

    class Usage:
        free = 100 * MIB
    monkeypatch.setattr(storage.files.shutil, "disk_usage", lambda p: Usage)
    with pytest.raises(StorageError, match=f"not enough free space in '{root}': 100 MiB free"):
        with storage.scratch_dir(64 * MIB, root=root):
            pass
    assert not root.exists()


def test_full_disk_while_writing_is_a_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    root = tmp_path / "root"
    real_write = os.write
    calls = {"n": 0}

    def write(fd, data):
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)
    with pytest.raises(StorageError, match="disk full while writing .*big.bin"):
        with storage.scratch_dir(64 * MIB, root=root) as s:
            monkeypatch.setattr(storage.files.os, "write", write)
            try:
                storage.write_file(s / "big.bin", 40 * MIB, chunk=MIB)
            finally:
                monkeypatch.setattr(storage.files.os, "write", real_write)
    assert not root.exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_dev_full_gives_disk_full_errors():
    with pytest.raises(StorageError, match="disk full while writing '/dev/full'"):
        storage.write_file("/dev/full", MIB)


# ---------------------------------------------------------------- the page cache and reads

def test_write_file_is_seeded_random_not_zeros(scratch):
    storage.write_file(scratch / "a", 64 * KIB, seed=3)
    storage.write_file(scratch / "b", 64 * KIB, seed=3)
    data = (scratch / "a").read_bytes()
    assert data == (scratch / "b").read_bytes() and len(set(data)) > 200 and data.count(0) < 1000


def test_eviction_empties_the_page_cache(scratch):
    path = scratch / "f"
    storage.write_file(path, 8 * MIB)
    if storage.page_cache_fraction(path) is None:
        pytest.skip("mincore unavailable")
    assert storage.page_cache_fraction(path) > 0.9  # just written
    method = storage.cold_method(path)
    if method is None:
        pytest.skip(f"no cold read possible on {storage.file_system(path)}")
    if method == "fadvise":
        assert storage.page_cache_fraction(path) <= 0.05
        storage.read_sequential(path, MIB)  # a warm read brings it back
        assert storage.page_cache_fraction(path) > 0.9
        r = storage.read_sequential(path, MIB, cold=True)
        assert r.resident_before <= 0.05 and r.method == "fadvise"


@pytest.mark.parametrize("threads,block", [(1, 4 * KIB), (3, 64 * KIB), (4, 3 * MIB)])
def test_sequential_reads_every_byte(scratch, threads, block):
    path = scratch / "f"
    storage.write_file(path, 5 * MIB + 12345)
    r = storage.read_sequential(path, block, threads=threads)
    assert r.nbytes == 5 * MIB + 12345 and r.threads == threads and r.gbps > 0 and r.method == "page cache"


def test_o_direct_reads_when_the_file_system_allows(scratch):
    path = scratch / "f"
    storage.write_file(path, 4 * MIB)
    if not storage.o_direct_works(path):
        pytest.skip("O_DIRECT not supported here")
    r = storage.read_sequential(path, 64 * KIB, threads=2, cold=True, method="o_direct")
    assert r.nbytes == 4 * MIB and r.method == "o_direct"
    with pytest.raises(ValueError, match="multiples of 4096"):
        storage.read_sequential(path, 6000, cold=True, method="o_direct")


def test_random_reads_distinct_blocks_and_percentiles(scratch):
    path = scratch / "f"
    storage.write_file(path, 4 * MIB)
    r = storage.random_reads(path, 300, threads=2, cold=False, seed=1)
    assert r.reads == len(r.latencies_us) == 300 and r.iops > 0
    assert 0 < r.percentile(50) <= r.percentile(99) <= max(r.latencies_us)
    with pytest.raises(ValueError, match="reads="):
        storage.random_reads(path, 4 * MIB // (4 * KIB) + 1)


def test_read_sweep_rows_are_time_based_samples(scratch):
    path = scratch / "f"
    storage.write_file(path, 2 * MIB)
    rows = storage.read_sweep(path, [4 * KIB, MIB], [1, 2], min_seconds=0.02, method=None)
    assert [(r["sweep"], r["block_size"], r["threads"]) for r in rows] == [
        ("block", 4 * KIB, 1), ("block", MIB, 1), ("threads", MIB, 1), ("threads", MIB, 2)]
    assert all(r["read"] == "page cache" and r["gbps_min"] <= r["gbps"] <= r["gbps_max"] for r in rows)
    assert all(r["seconds"] >= 0.02 and r["passes"] >= 1 for r in rows)
    with pytest.raises(ValueError, match="min_seconds=0"):
        storage.read_sweep(path, [MIB], [1], min_seconds=0)


def test_time_based_random_reads_pass_over_every_block_again(scratch):
    """A 2 MiB file has 512 blocks of 4 KiB: a sample longer than one pass reads them again, in a new order, evicted
    first when cold (so no read comes from the cache)."""
    path = scratch / "f"
    storage.write_file(path, 2 * MIB)
    r = storage.sample_random(path, threads=2, cold=False, min_seconds=0.05, seed=3)
    assert r.seconds >= 0.05 and r.reads == len(r.latencies_us) and r.reads % 512 == 0 and r.reads >= 512
    assert r.threads == 2 and r.method == "page cache"
    runs = storage.sample_sequential(path, MIB, min_seconds=0.01)
    assert sum(x.seconds for x in runs) >= 0.01 and all(x.nbytes == 2 * MIB for x in runs)


def test_fio_commands_name_what_they_measure():
    assert "--numjobs=4" in storage.fio_command("qd4", 64) and "--rw=randread --bs=4k" in storage.fio_command("qd1", 64)
    assert "--direct=1" in storage.fio_command("cold", 64) and "--pre_read=1" in storage.fio_command("warm", 64)
    assert all("--time_based --runtime=2" in storage.fio_command(k, 64) for k in ("warm", "cold", "qd1", "qd4"))
    with pytest.raises(ValueError, match="kind='qd8'"):
        storage.fio_command("qd8", 64)


@pytest.mark.parametrize("kw,match", [({"block_size": 0}, "block_size=0"), ({"threads": 0}, "threads=0"),
                                      ({"threads": 65}, "threads=65"), ({"method": "mmap"}, "method='mmap'")])
def test_read_arguments_validated(scratch, kw, match):
    path = scratch / "f"
    storage.write_file(path, MIB)
    args = {"block_size": MIB, **kw}
    with pytest.raises(ValueError, match=match):
        storage.read_sequential(path, **args)


def test_missing_file_is_named(scratch):
    with pytest.raises(StorageError, match="no file to read at .*nope"):
        storage.read_sequential(scratch / "nope", MIB)


def test_file_system_is_named(tmp_path):
    assert isinstance(storage.file_system(tmp_path), str) and storage.file_system(tmp_path)


# ---------------------------------------------------------------- checkpoints

def test_recipe_state_is_deepseeks_10_bytes_per_parameter():
    state = storage.recipe_state(1024 * 40, seed=1)
    assert storage.BYTES_PER_PARAM == 10
    assert storage.state_bytes(state) == 10 * 1024 * 40
    assert {t.dtype for k, t in state.items() if k.endswith(".master")} == {torch.float32}
    assert {t.dtype for k, t in state.items() if not k.endswith(".master")} == {torch.bfloat16}
    assert all((state[k] > 0).all() for k in state if k.endswith("exp_avg_sq"))
    with pytest.raises(ValueError, match="params=10"):
        storage.recipe_state(10)


def test_bitwise_mismatches_sees_one_flipped_bit_a_dtype_and_a_missing_key():
    state = storage.recipe_state(4096, seed=2)
    same = {k: v.clone() for k, v in state.items()}
    assert storage.bitwise_mismatches(same, state) == []
    key = "layer0.weight"
    flipped = dict(same)
    flipped[key] = same[key].clone()
    flipped[key].view(torch.int16).view(-1)[7] ^= 1  # the lowest mantissa bit of one BF16 value
    assert storage.bitwise_mismatches(flipped, state) == [key]
    assert storage.bitwise_mismatches({**same, key: same[key].float()}, state) == [key]
    assert storage.bitwise_mismatches({k: v for k, v in same.items() if k != key}, state) == [key]


def test_write_durably_replaces_atomically_and_leaves_nothing(scratch, monkeypatch):
    path = scratch / "ckpt.pt"
    path.write_bytes(b"old")
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.fstat(fd)), real(fd))[1])
    storage.write_durably(b"new bytes", path)
    assert path.read_bytes() == b"new bytes" and sorted(p.name for p in scratch.path.iterdir()) == ["ckpt.pt"]
    assert [stat.S_ISDIR(s.st_mode) for s in synced] == [False, True]  # the file, then its directory
    assert synced[0].st_size == len(b"new bytes") and synced[0].st_ino == path.stat().st_ino


def test_a_full_disk_during_a_durable_write_is_clear_and_leaves_nothing(scratch, monkeypatch):
    path = scratch / "ckpt.pt"
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(StorageError, match="disk full while writing .*ckpt.pt"):
        storage.write_durably(b"x" * 1000, path)
    assert list(scratch.path.iterdir()) == []


def test_a_failed_durable_write_leaves_the_old_file(scratch, monkeypatch):
    path = scratch / "ckpt.pt"
    path.write_bytes(b"old")
    monkeypatch.setattr(os, "replace", lambda a, b: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(OSError, match="I/O error"):
        storage.write_durably(b"new", path)
    assert path.read_bytes() == b"old" and sorted(p.name for p in scratch.path.iterdir()) == ["ckpt.pt"]


def test_async_checkpointer_stages_orders_and_reports_errors(scratch):
    done = []

    def write(state, path):
        time.sleep(0.05 if not done else 0)
        if path == "bad":
            raise OSError(28, "No space left on device")
        done.append((path, state["x"].clone()))
    ck = storage.AsyncCheckpointer(write)
    x = torch.zeros(4)
    ck.save({"x": x}, "a")
    x += 1  # the training step changes the tensor while the first write is still sleeping
    ck.save({"x": x}, "b")
    ck.wait()
    assert [p for p, _ in done] == ["a", "b"] and done[0][1].tolist() == [0] * 4 and done[1][1].tolist() == [1] * 4
    ck.save({"x": x}, "bad")
    with pytest.raises(OSError, match="No space left"):
        ck.wait()
    ck.save({"x": x}, "c")
    ck.wait()
    ck.close()
    assert done[-1][0] == "c" and not ck._thread.is_alive()


def test_measure_checkpoints_reads_back_every_async_save(scratch):
    out = storage.measure_checkpoints(scratch, 1024 * 64, rounds=2, step_ms=2)
    assert out["mismatches"] == [[], []] and len(out["rounds"]) == 2 and out["n_steps"] >= 3
    assert out["file_bytes"] >= out["state_bytes"] == 10 * 1024 * 64
    for r in out["rounds"]:
        assert r["exposed_s"] == pytest.approx(r["overlap_s"] - r["steps_s"]) and r["stage_s"] <= r["overlap_s"]
        assert r["blocking_s"] == pytest.approx(r["serialize_s"] + r["disk_s"])
    assert out["serialize_gbps"] > 0 and out["disk_gbps"] > 0
    with pytest.raises(ValueError, match="rounds=0"):
        storage.measure_checkpoints(scratch, 4096, rounds=0)


def test_hidden_fraction():
    assert storage.hidden_fraction(1.0, 10.0, 10.25) == pytest.approx(0.75)
    assert storage.hidden_fraction(1.0, 10.0, 12.0) == 0.0  # slower than not overlapping at all
    assert storage.hidden_fraction(1.0, 10.0, 9.9) == 1.0  # noise: clipped
    with pytest.raises(ValueError, match="t_save=0"):
        storage.hidden_fraction(0, 1, 1)


def test_async_checkpoint_arguments_checked_before_any_rank_starts(scratch):
    for kw, match in [({"params_per_rank": 10}, "params_per_rank=10"), ({"rounds": 0}, "rounds=0"),
                      ({"device_ms": -1}, "device_ms=-1")]:
        args = {"params_per_rank": 4096, **kw}
        with pytest.raises(ValueError, match=match):
            storage.measure_async_checkpoint(scratch, **args)


def test_async_checkpoint_on_two_gloo_ranks(tmp_path):
    with storage.scratch_dir(64 * MIB, root=tmp_path / "root") as s:
        out = storage.measure_async_checkpoint(s, 1024 * 64, rounds=2, device_ms=5)
    assert not (tmp_path / "root").exists()
    assert out["mismatches"] == {0: [], 1: []} and out["changed_during_write"]
    assert sorted(out["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # one file per rank: sharded
    assert out["checkpoint_bytes"] == 2 * 10 * 1024 * 64
    assert len(out["rounds"]) == 2 and 0 <= out["hidden_fraction"] <= 1
    for r in out["rounds"]:
        assert r["t_block"] <= r["t_overlap"] and r["t_save"] > 0


# ---------------------------------------------------------------- 3FS's scale

def test_3fs_figures_checked_by_arithmetic():
    per_node = storage.read_per_node()
    assert per_node["per_node_bytes_s"] == pytest.approx(6.6 * 2**40 / 180)
    assert per_node["line_rate_bytes_s"] == 50e9  # 2 x 200 Gbps
    assert per_node["fraction_of_line_rate"] == pytest.approx(0.806, abs=1e-3)
    sort = storage.graysort()
    assert sort["tib_per_min"] == pytest.approx(sort["published_tib_per_min"], rel=2e-3)
    assert storage.kvcache_peak_per_client()["fraction_of_nic"] == pytest.approx(40 * 2**30 / 50e9)
    assert "e2cef82" in storage.source("read_aggregate_tib_s")
    # the service's figures are lab 14's (data/deepseek_v3_service.json), not copied
    assert storage.service("input_tokens_cache_hit_per_day") / storage.service("input_tokens_per_day") == \
        pytest.approx(storage.service("cache_hit_rate"), abs=5e-4)
    assert storage.service("threefs_kvcache_read_gibs") == 40
    with pytest.raises(ValueError, match="not a fact"):
        storage.fact("write_tib_s")


def test_v3_checkpoint_follows_lab_09_13_memory_recipe():
    ck = storage.v3_checkpoint()
    counts = models.count_params(v3model.config())
    assert ck["params"] == pytest.approx(counts["total_with_mtp"], rel=1e-12)
    assert ck["params"] - ck["mtp_params"] == pytest.approx(counts["total"], rel=1e-12)  # 671B + the MTP module
    assert ck["bytes_per_param"] == pytest.approx(v3model.fact("master_weight_bytes")
                                                  + 2 * v3model.fact("adam_moment_bytes")) == 8
    assert ck["bytes_per_param_with_weights"] == pytest.approx(10)
    # lab 13's ZeRO-1 optimizer shard per GPU, times the GPUs, is the whole optimizer state once
    assert ck["optimizer_gb_per_gpu"] * ck["gpus"] == pytest.approx(ck["resumable_gb"], rel=1e-9)
    assert ck["resumable_gb"] == pytest.approx(5461.1, abs=0.1) and ck["with_weights_gb"] == pytest.approx(6826.4, abs=0.1)
    assert storage.v3_checkpoint_seconds(6.6 * 2**40) == pytest.approx(0.7526, abs=1e-4)
    assert storage.v3_checkpoint_seconds(6.6 * 2**40, with_weights=True) == pytest.approx(0.9407, abs=1e-4)


def test_checkpoint_seconds_takes_the_slower_limit():
    assert storage.checkpoint_seconds(100, 4, 400, 3) == pytest.approx(100 / 3)  # storage-bound
    assert storage.checkpoint_seconds(100, 4, 400, 1000) == pytest.approx(100 / 4 / 50)  # NIC-bound
    for bad, match in [((0, 1, 1, 1), "checkpoint_gb=0"), ((1, 0, 1, 1), "ranks=0"), ((1, 1.5, 1, 1), "ranks=1.5"),
                       ((1, 1, -2, 1), "nic_gbps=-2"), ((1, 1, 1, math.inf), "storage_gbs=inf")]:
        with pytest.raises(ValueError, match=match):
            storage.checkpoint_seconds(*bad)


def test_pretraining_and_kv_cache_reads():
    assert [storage.token_id_bytes(v) for v in (256, 257, 50_000, 65_536, 129_280)] == [1, 2, 2, 2, 4]
    pt = storage.pretraining_reads()
    assert pt["tokens_per_s"] == pytest.approx(1e12 / (180_000 / 2048 * 3600))
    assert pt["bytes_s"] == pytest.approx(pt["tokens_per_s"] * 4) and pt["fraction_of_3fs"] < 1e-5
    kv = storage.kv_cache_reads()
    mla = kvcache.deepseek_v3_kv(v3model.config().values)["mla"]
    assert kv["bytes_per_token"] == mla == 61 * 576 * 2
    assert kv["bytes_s"] == pytest.approx(342e9 * mla / 86_400)
    assert kv["prefill_nodes"] == pytest.approx(608e9 / 86_400 / 73.7e3)  # lab 14's day accounting
    assert kv["per_prefill_node_bytes_s"] == pytest.approx(73.7e3 * 0.5625 * mla, rel=1e-3)  # lab 14's 2.9 GB/s
    assert kv["peak_if_aggregate"] > 6  # 40 GiB/s cannot be the sum over all of the service's clients
    saved = storage.prefill_saved()
    active = models.count_params(v3model.config())["active_compute"]
    assert saved["flops_per_day"] == pytest.approx(342e9 * 2 * active)
    assert saved["nodes_at_peak"] == pytest.approx(saved["flops_per_day"] / 1979e12 / 8 / 86_400)
    assert saved["breakeven_read_bytes_s_per_gpu"] == pytest.approx(mla * 1979e12 / (2 * active))
    assert saved["nodes_at_peak"] < saved["nodes_at_service_rate"]


def test_warm_reads_start_from_a_cached_file(scratch):
    path = scratch / "f"
    storage.write_file(path, 4 * MIB)
    if storage.cold_method(path) != "fadvise":
        pytest.skip("needs fadvise eviction")
    assert storage.page_cache_fraction(path) <= 0.05
    r = storage.random_reads(path, 200, cold=False)
    assert r.resident_before >= 0.99 and r.method == "page cache"
    storage.evict(path)
    assert storage.read_sequential(path, MIB).resident_before >= 0.99

"""Checkers for lab 11 (beyond the GPU): KV-cache sizing, paged allocation, GPU sharing, the I/O path of a checkpoint
(a durable write, and the build exercise: an asynchronous checkpoint writer) and checkpoint time at scale."""
from __future__ import annotations

import contextlib
import errno
import math
import os
import stat
import threading
import time

import torch

from common.core.checks import checker, expect, fail
from common.exercises.cases import as_number, expect_number, fresh_cases, learner_call, refused, watched
from common.exercises.formulas import answered, name_formula
from common.systems import storage
from common.systems.host import sharing
from common.systems.storage import writer
from common.systems.inference import kvcache

BYTES_PER_VALUE = (1, 2, 4)  # FP8/INT8, BF16/FP16, FP32: each gets a fixed case


@checker("11.1", "KV-cache bytes per token (MHA / GQA)")
def check_kv_bytes_per_token(fn):
    """fn(layers, heads, kv_heads, head_dim, bytes_per_value) -> bytes of K and V cached per token."""
    with fresh_cases() as cases:
        rng = cases.rng
        # asymmetric first cases (layers, heads, kv_heads, head_dim and bytes all different, so no two mistakes give
        # the same number), every element size fixed, MHA and MQA included
        cases_ = [(24, 32, 8, 128, 2), (80, 64, 8, 96, 1), (28, 16, 4, 64, 4), (32, 32, 32, 128, 2),
                  (18, 8, 1, 256, 2)] + [
            (rng.randint(1, 96), h, rng.choice([d for d in (1, 2, 4, 8, h) if h % d == 0]), rng.choice([64, 128]),
             rng.choice(BYTES_PER_VALUE)) for h in (rng.choice([16, 32, 64, 128]) for _ in range(4))]
        for layers, heads, kv_heads, d, b in cases_:
            expected = kvcache.kv_bytes_per_token(layers, kv_heads, d, d, b)
            where = f"layers={layers}, heads={heads}, kv_heads={kv_heads}, head_dim={d}, bytes={b}"
            call = f"kv_bytes_per_token({layers}, {heads}, {kv_heads}, {d}, {b})"
            got = as_number(learner_call(fn, (layers, heads, kv_heads, d, b), call,
                                         (kvcache.kv_bytes_per_token,), library=True), call, "bytes, a number")
            mistakes = [
                (kv_heads != heads, layers * heads * 2 * d * b,
                 f"you cached K and V for all {heads} query heads; with grouped-query attention only the "
                 f"{kv_heads} KV heads are cached"),
                (True, expected / 2, "half the answer -- both K and V are cached"),
                (layers > 1, expected / layers, "the figure for one layer -- every layer has its own cache"),
                (b != 1, expected / b, "the count of values, not bytes -- multiply by bytes_per_value"),
                (b != 2, expected / b * 2, "a fixed 2 bytes per value -- use bytes_per_value"),
                (True, expected * 8, "bits, not bytes"),
            ]
            named = [why for applies, value, why in mistakes if applies and math.isclose(got, value, rel_tol=1e-12)
                     and not math.isclose(value, expected, rel_tol=1e-12)]
            if named:
                fail(f"{where}: got {got:.10g}: {' or '.join(named)}")
            expect_number(got, expected, f"bytes per token for {where}", rtol=1e-12)
    return "K and V, per KV head, per layer (GQA caches only the KV heads), for 1-, 2- and 4-byte values"


@checker("11.2", "MLA cache bytes per token")
def check_mla_bytes_per_token(fn):
    """fn(layers, kv_lora_rank, rope_dim, bytes_per_value) -> bytes cached per token by multi-head latent attention."""
    with fresh_cases() as cases:
        rng = cases.rng
        cases_ = [(61, 512, 64, 2), (27, 256, 32, 1), (40, 1024, 64, 4)] + [
            (rng.randint(1, 100), rng.choice([256, 512, 1024]), rng.choice([32, 64]), rng.choice(BYTES_PER_VALUE))
            for _ in range(4)]
        for layers, rank, rope, b in cases_:
            expected = kvcache.mla_bytes_per_token(layers, rank, rope, b)
            where = f"layers={layers}, kv_lora_rank={rank}, rope_dim={rope}, bytes={b}"
            call = f"mla_bytes_per_token({layers}, {rank}, {rope}, {b})"
            got = as_number(learner_call(fn, (layers, rank, rope, b), call, (kvcache.mla_bytes_per_token,),
                                         library=True), call, "bytes, a number")
            if got == layers * rank * b:
                fail(f"{where}: you left out the decoupled RoPE key ({rope} values per layer), which MLA caches "
                     f"beside the latent")
            if got == 2 * expected or got == layers * (2 * rank + rope) * b:
                fail(f"{where}: got {got:.10g}: MLA caches ONE latent from which both K and V are recovered, not "
                     f"separate K and V")
            if layers > 1 and got == expected / layers:
                fail(f"{where}: got {got:.10g}, the figure for one layer -- every layer caches its own latent")
            if b != 1 and got == expected / b:
                fail(f"{where}: got {got:.10g}, the count of values -- multiply by bytes_per_value")
            expect_number(got, expected, f"MLA bytes per token for {where}", rtol=1e-12)
    return "layers x (latent + RoPE key) x bytes: 576 values per layer for DeepSeek-V3"


@checker("11.3", "waste of paged allocation")
def check_paged_waste(fn):
    """fn(lengths, block_size) -> token slots reserved but unused when each sequence gets whole blocks."""
    with fresh_cases() as cases:
        rng = cases.rng
        cases_ = [([16, 32, 48], 16), ([1, 17, 33], 16), ([5], 8), ([40, 7, 64, 100], 32)] + [
            ([rng.randint(1, 4000) for _ in range(rng.randint(1, 50))], rng.choice([8, 16, 32, 128]))
            for _ in range(5)]
        for lengths, block in cases_:
            expected = kvcache.paged_waste(lengths, block)
            shown = f"{lengths[:6]}{'...' if len(lengths) > 6 else ''}"
            call = f"paged_waste({shown}, {block})"
            passed = list(lengths)
            got = as_number(learner_call(fn, (passed, block), call, (kvcache.paged_waste,), library=True), call,
                            "a number of token slots")
            expect(passed == lengths, f"{call}: your function changed the list of lengths it was given; work on a "
                                      f"copy")
            plus_one = sum((n // block + 1) * block - n for n in lengths)
            if got == plus_one and got != expected:
                fail(f"lengths {shown} with block {block}: got {got:.0f}; a length that is an exact multiple of "
                     f"the block fills its blocks exactly (waste 0) -- use ceil(n / block), not n // block + 1")
            if got == sum(n % block for n in lengths) and got != expected:
                fail(f"lengths {shown} with block {block}: got {got:.0f}: you counted the tokens in the last, "
                     f"partial block; the waste is the EMPTY slots of that block")
            if got == sum(-n % block for n in lengths[:1]) and len(lengths) > 1 and got != expected:
                fail(f"lengths {shown} with block {block}: got {got:.0f}, the waste of the first sequence only; "
                     f"sum over every sequence")
            expect(got == expected, f"{call}: expected {expected}, got {got:.10g}")
    return "sum of ceil(n / block) * block - n: less than one block per sequence"


def _sharing(demand, n, mode, **instead):
    """The right utilisation, except for the modes in `instead` ({mode: fn(demand, n)})."""
    if mode in instead:
        return instead[mode](demand, n)
    return sharing.shared_utilisation(demand, n, mode)


SHARING_MISTAKES = [  # (what it is, what that mistake returns): named when every case matches it
    ("time slicing runs one job at a time, each at its own demand while it runs: the utilisation is the demand, not "
     "demand / n_jobs", lambda d, n, m: _sharing(d, n, m, **{"time-slicing": lambda d, n: d / n})),
    ("MIG cuts an H100 into at most 7 compute slices of 1/7 each, not 8",
     lambda d, n, m: _sharing(d, n, m, mig=lambda d, n: min(n, 8) * min(d, 1 / 8))),
    ("under MPS the jobs' kernels run at the same time, so their demands add up (to at most the whole GPU); that "
     "is time slicing's answer", lambda d, n, m: _sharing(d, n, m, mps=lambda d, n: d)),
    ("MIG cuts the GPU into fixed 1/7 slices: a job cannot use another's idle slice, as the jobs share the GPU "
     "under MPS", lambda d, n, m: _sharing(d, n, m, mig=lambda d, n: min(1.0, n * d))),
    ("the MIG and MPS formulas are swapped", lambda d, n, m: _sharing(
        d, n, m, mig=lambda d, n: min(1.0, n * d), mps=lambda d, n: min(n, 7) * min(d, 1 / 7))),
    ("the demand is a fraction of the whole GPU, not of a 1/7 MIG slice",
     lambda d, n, m: _sharing(d, n, m, mig=lambda d, n: min(n, 7) * d / 7)),
    ("that is a percentage; return a fraction of the GPU (0 to 1)", lambda d, n, m: 100 * _sharing(d, n, m)),
]


@checker("11.4", "GPU sharing utilisation")
def check_shared_utilisation(fn):
    """fn(demand, n_jobs, mode) -> fraction of the GPU kept busy; mode in time-slicing, mig, mps (7 MIG slices)."""
    with fresh_cases() as cases:
        rng = cases.rng
        cases_ = [(0.1, 7, "mig"), (0.3, 3, "mig"), (0.1, 10, "mig"), (0.3, 5, "mps"), (0.1, 4, "time-slicing"),
                  (0.2, 3, "mps"), (0.05, 9, "mig")] + [
            (round(rng.uniform(0.02, 1.0), 3), rng.randint(1, 12), rng.choice(sharing.MODES)) for _ in range(8)]
        rows = []
        for demand, n, mode in cases_:
            call = f"shared_utilisation({demand}, {n}, {mode!r})"

            def ask():
                got = as_number(learner_call(fn, (demand, n, mode), call, (sharing.shared_utilisation,),
                                             library=True), call, "a fraction")
                return call, (demand, n, mode), got, sharing.shared_utilisation(demand, n, mode)
            if not answered(rows, ask):
                break
        name_formula(rows, SHARING_MISTAKES)
        for call, (demand, n, mode), got, expected in rows:
            where = f"demand={demand}, n_jobs={n}, mode={mode!r}"
            if mode == "mig" and demand > 1 / 7 and math.isclose(got, min(n, 7) * demand):
                fail(f"{where}: a MIG instance is a hard slice of 1/7 of the SMs; a job cannot use more than its "
                     f"slice however much it wants")
            if mode == "mig" and n > 7 and math.isclose(got, n * min(demand, 1 / 7)):
                fail(f"{where}: at most 7 MIG instances fit on the GPU; the other jobs wait")
            if mode == "mig" and not math.isclose(expected, min(n, 7) / 7) and math.isclose(got, min(n, 7) / 7):
                fail(f"{where}: got {got:.4g}: a job uses at most its demand ({demand}) inside its 1/7 slice, not "
                     f"the whole slice")
            if mode == "mps" and n * demand > 1 and got > 1:
                fail(f"{where}: got {got:.4g}; utilisation cannot exceed the whole GPU (1.0)")
            if mode == "time-slicing" and n > 1 and math.isclose(got, min(1.0, n * demand)) \
                    and not math.isclose(expected, min(1.0, n * demand)):  # demand 1.0: the two agree
                fail(f"{where}: time slicing runs one context at a time, so the jobs do not add up")
            expect_number(got, expected, f"utilisation for {where}", rtol=1e-9, atol=1e-12)
    return "time slicing keeps one job's demand; MIG caps each job at its slice; MPS adds demands up to 1"


def _number(fn, name: str, args: tuple, reference, what: str) -> float:
    """The learner's fn(*args) as one number; a crash, a call to `reference` or another type is a verdict that
    writes the call out."""
    text = f"{name}({', '.join(map(str, args))})"
    return as_number(learner_call(fn, args, text, (reference,), library=True), text, what)


@checker("11.7", "checkpoint seconds from size, ranks and bandwidth")
def check_checkpoint_seconds(fn):
    """fn(checkpoint_gb, ranks, nic_gbps, storage_gbs) -> seconds to write the checkpoint: each rank writes its share
    through its own NIC (Gbps: bits), all of them into storage of storage_gbs GB/s (bytes) in all."""
    with fresh_cases() as cases:
        rng = cases.rng
        # fixed first cases: NIC-bound, storage-bound, one rank, and DeepSeek-V3 on 256 nodes against 3FS's 6.6 TiB/s
        cases_ = [(6826.4, 256, 200.0, 7256.8), (100.0, 4, 400.0, 3.0), (40.0, 1, 100.0, 50.0),
                  (1000.0, 16, 200.0, 500.0), (250.0, 8, 25.0, 900.0)] + [
            (round(rng.uniform(1, 10_000), 1), rng.choice([1, 2, 8, 64, 512]), rng.choice([25.0, 100.0, 200.0, 400.0]),
             round(rng.uniform(1, 8000), 1)) for _ in range(6)]
        for args in cases_:
            size, ranks, nic, store = args
            expected = storage.checkpoint_seconds(*args)
            got = _number(fn, "checkpoint_seconds", args, storage.checkpoint_seconds, "seconds, a number")
            where = f"checkpoint_gb={size}, ranks={ranks}, nic_gbps={nic}, storage_gbs={store}"
            nic_s, store_s = size / ranks / (nic / 8), size / store
            mistakes = [
                (max(size / ranks / nic, store_s), "NIC rates are in gigaBITS per second: divide by 8 for bytes"),
                (nic_s, f"the storage's {store} GB/s is shared by all {ranks} writers: it caps their total"),
                (store_s, f"each rank's NIC ({nic} Gbps) also limits its share"),
                (max(size / (nic / 8), store_s), f"all {ranks} ranks write in parallel, each only its 1/{ranks} share"),
                (nic_s + store_s, "the two limits act at once (the bytes stream through both): take the slower, "
                                  "not the sum"),
                (size / (ranks * nic / 8 + store), "bandwidths in series do not add: the slower limit sets the pace"),
                (min(nic_s, store_s), "the FASTER of the two limits: the write goes at the pace of the slower one"),
                (max(size / ranks / (nic * 8), store_s), "you multiplied the Gbps by 8; gigabits to gigabytes is / 8"),
                (max(nic_s, size / (store / 8)), "storage_gbs is already GB/s (bytes): only the NIC's Gbps needs / 8"),
                (expected / 60, "minutes, not seconds"),
                (expected * 1e9 / 2**30, "GB are 1e9 bytes here, not GiB"),
                (expected * 2**30 / 1e9, "GB are 1e9 bytes here, not GiB"),
            ]
            named = [why for value, why in mistakes if math.isclose(got, value, rel_tol=1e-9)
                     and not math.isclose(value, expected, rel_tol=1e-9)]
            if named:
                fail(f"{where}: got {got:.10g} s: {' -- or '.join(dict.fromkeys(named))}")
            expect_number(got, expected, f"seconds for {where}", rtol=1e-9)
    return "max(checkpoint / ranks / (NIC / 8), checkpoint / storage): parallel writers, shared storage"


# ---------------------------------------------------------------- 11.5 and 11.6: the I/O path of a checkpoint

@contextlib.contextmanager
def _watch_os(events: list):
    """Record the learner's os.fsync / os.fdatasync (what was synced: inode, directory or not, its size then) and
    os.replace / os.rename (source, destination) in `events`, in order, while the block runs."""
    real = {name: getattr(os, name) for name in ("fsync", "fdatasync", "replace", "rename") if hasattr(os, name)}

    def synced(name):
        def fsync(fd):
            st = os.fstat(fd)
            events.append(("fsync", st.st_ino, stat.S_ISDIR(st.st_mode), st.st_size))
            return real[name](fd)
        return fsync

    def renamed(name):
        def rename(src, dst, *a, **k):
            result = real[name](src, dst, *a, **k)
            events.append(("rename", os.path.abspath(src), os.path.abspath(dst)))
            return result
        return rename
    for name in real:
        setattr(os, name, synced(name) if "sync" in name else renamed(name))
    try:
        yield events
    finally:
        for name, fn in real.items():
            setattr(os, name, fn)


def _open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def _durable_verdict(events, data: bytes, path: str, before: set) -> str:
    """What is wrong with the write whose os calls are `events`, or ""."""
    directory = os.path.dirname(path)
    if not os.path.isfile(path):
        return f"no file at {path} afterwards"
    got = open(path, "rb").read()
    if got != data:
        return f"{path} holds {len(got):,} bytes that are not the {len(data):,} bytes given"
    left = sorted(set(os.listdir(directory)) - before - {os.path.basename(path)})
    if left:
        return f"left behind in the directory: {', '.join(left)} (rename the temporary file onto path, or remove it)"
    ino, dir_ino = os.stat(path).st_ino, os.stat(directory).st_ino
    renames = [i for i, e in enumerate(events) if e[0] == "rename" and e[2] == path]
    if not renames:
        return ("path was written in place (nothing renamed onto it): a crash in the middle leaves half a checkpoint "
                "where the last good one was; write a temporary file in the same directory, then os.replace it onto "
                "path")
    r = renames[-1]
    if os.path.dirname(events[r][1]) != directory:
        return (f"the temporary file {events[r][1]} is not in path's directory: os.replace is atomic only within one "
                f"file system (and /tmp is often another one); create it beside path")
    file_syncs = [(i, e) for i, e in enumerate(events) if e[0] == "fsync" and not e[2] and e[1] == ino]
    if not file_syncs:
        return ("the bytes were never fsynced: until os.fsync returns they may be only in the page cache, and a crash "
                "loses them; flush, then os.fsync(f.fileno()) before the rename")
    if all(i > r for i, _ in file_syncs):
        return ("the file was fsynced after the rename: a crash between the two leaves a renamed file whose bytes "
                "never reached the disk; fsync the temporary file before os.replace")
    size = max(e[3] for i, e in file_syncs if i < r)
    if size < len(data):
        return (f"the file held {size:,} of the {len(data):,} bytes when you fsynced it: Python still had the rest in "
                f"its buffer; call f.flush() before os.fsync(f.fileno())")
    dir_syncs = [i for i, e in enumerate(events) if e[0] == "fsync" and e[2] and e[1] == dir_ino]
    if not dir_syncs:
        return ("the directory was never fsynced: the rename is an entry in the directory, durable only once the "
                "directory is (os.open(directory, os.O_RDONLY), os.fsync, os.close)")
    if all(i < r for i in dir_syncs):
        return "the directory was fsynced before the rename; the rename is the directory's change: fsync it after"
    return ""


@checker("11.5", "a durable write", in_kernel="it watches the learner's os.fsync and os.replace calls on real files")
def check_write_durably(write_durably):
    """write_durably(data, path): afterwards path holds data and survives a crash -- written to a temporary file in
    the same directory, flushed and fsynced, renamed onto path, the directory fsynced; nothing left behind."""
    cases = [("a 100-byte file (it fits in Python's write buffer)", b"checkpoint" * 10),
             ("3 MiB of checkpoint bytes, over an older checkpoint", bytes(range(256)) * (3 * storage.MIB // 256)),
             ("an empty file", b"")]
    with storage.scratch_dir(64 * storage.MIB) as scratch:
        for i, (what, data) in enumerate(cases):
            directory = scratch.path / f"case{i}"
            directory.mkdir()
            path = str(directory / "checkpoint.pt")
            if i == 1:
                with open(path, "wb") as f:
                    f.write(b"the previous checkpoint")
            before, fds, events = set(os.listdir(directory)), _open_fds(), []
            call = f"write_durably(data, path) for {what}"
            with _watch_os(events):
                learner_call(write_durably, (data, path), call, (storage.write_durably,), library=True)
            wrong = _durable_verdict(events, data, path, before)
            if wrong:
                fail(f"{call}: {wrong}")
            if fds is not None and _open_fds() > fds:
                fail(f"{call}: {_open_fds() - fds} file descriptor(s) left open: close the file and the directory")
    return "write, flush, fsync, os.replace onto path, fsync the directory: atomic and durable, nothing left behind"


class _Writes:
    """The write(state, path) a checker hands the learner's checkpointer: it records each write (its order, the
    values it received, how many ran at once), holds the writes of `held` paths until released, and fails the
    writes of `failing` paths with a full disk."""

    def __init__(self, held=(), failing=()):
        self.lock = threading.Lock()
        self.gates = {p: threading.Event() for p in held}
        self.failing = set(failing)
        self.active = self.max_active = 0
        self.started, self.completed, self.got = [], [], {}

    def __call__(self, state, path):
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.started.append(path)
        try:
            if path in self.gates:
                self.gates[path].wait(10)
            if path in self.failing:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.got[path] = {k: (v, v.detach().clone()) for k, v in state.items()}
            time.sleep(0.005)
        finally:
            with self.lock:
                self.active -= 1
                self.completed.append(path)

    def release(self):
        for gate in self.gates.values():
            gate.set()


PATIENCE_S = 3.0  # how long a checker waits for a save() or wait() of the learner's writer on its tiny writes


def _within(seconds: float, fn, *args):
    """fn(*args) in a helper thread, under the library watch: (returned in time, its result or exception); a call
    from the learner's method into the workbook's library (its own AsyncCheckpointer among them) is a verdict."""
    box = {}

    def run():
        with watched((), (), True) as called:
            try:
                box["result"] = fn(*args)
            except BaseException as exc:  # handed back to the checker
                box["error"] = exc
        box["called"] = called
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if box.get("called"):
        raise refused(f"your AsyncCheckpointer's {getattr(fn, '__name__', 'method')}()", box["called"][0])
    return (not t.is_alive()), box


def _method(ck, name: str, *args):
    fn = getattr(ck, name, None)
    if not callable(fn):
        fail(f"your AsyncCheckpointer has no {name}() method: it needs save(state, path), wait() and close()")
    return fn


def _save(ck, state, path):
    """The learner's save(state, path), watched; its error is raised here."""
    _, box = _within(PATIENCE_S, _method(ck, "save"), state, path)
    if "error" in box:
        raise box["error"]


@checker("11.6", "an asynchronous checkpoint writer",
         in_kernel="it runs the learner's writer thread against writes it controls and times")
def check_async_checkpointer(AsyncCheckpointer):
    """AsyncCheckpointer(write) with save(state, path) (stage, queue, return), wait() (every save durable, a write's
    error re-raised) and close(): one background thread writes the saves in order."""
    if AsyncCheckpointer is storage.AsyncCheckpointer:
        fail("you passed storage.AsyncCheckpointer itself, the reference this exercise asks you to write; write "
             "your own class")
    if isinstance(AsyncCheckpointer, type) and issubclass(AsyncCheckpointer, storage.AsyncCheckpointer):
        fail("your class inherits storage.AsyncCheckpointer, the reference this exercise asks you to write")
    threads_before = set(threading.enumerate())
    writes = _Writes(held=("a",), failing=("bad",))
    ck = learner_call(AsyncCheckpointer, (writes,), "AsyncCheckpointer(write)", ((writer, "AsyncCheckpointer"),),
                      library=True)
    x = torch.zeros(8)
    done, box = _within(PATIENCE_S, _method(ck, "save"), {"x": x}, "a")
    if not done:
        writes.release()
        fail("save(state, 'a') did not return while its write was still running: it writes in the caller's thread, "
             "as the blocking save does; hand the write to a background thread and return once the state is staged")
    if "error" in box:
        raise box["error"]
    x += 1  # the next training step changes the tensor in place while 'a' is still being written
    _save(ck, {"x": x}, "b")
    time.sleep(0.05)
    if writes.max_active > 1:
        writes.release()
        fail("two writes ran at the same time ('a' was still being written when 'b' began): one thread per save "
             "races, and a later save can finish first; use ONE writer thread that takes the saves from a queue")
    writes.release()
    done, box = _within(PATIENCE_S, _method(ck, "wait"))
    expect(done, "wait() did not return after both writes finished (did the writer thread stop, or wait on "
                 "something that never comes?)")
    if "error" in box:
        raise box["error"]
    expect(writes.completed[:2] == ["a", "b"], f"after wait() the writes done were {writes.completed}: wait() must "
                                               f"return only once every save so far is written, in order")
    tensor, values = writes.got["a"]["x"]
    expect(tensor is not x and values.tolist() == [0.0] * 8,
           "the checkpoint 'a' holds values changed after save() returned: copy (stage) every tensor in save() -- "
           "the training step may change them in place as soon as save() returns")
    _save(ck, {"x": x}, "bad")
    done, box = _within(PATIENCE_S, _method(ck, "wait"))
    expect(done, "wait() did not return after a write failed: the writer thread must go on (and mark the save done) "
                 "when a write raises")
    expect("error" in box, "the write of 'bad' raised OSError (No space left on device) in the writer thread, and "
                           "wait() returned as if it had been saved: keep the error and re-raise it from wait()")
    _save(ck, {"x": x}, "c")
    done, box = _within(PATIENCE_S, _method(ck, "wait"))
    expect(not (done and "c" in writes.got and "error" in box),
           "wait() raised the old error again after the next save was written: re-raise each error once (take it "
           "out of the list as you raise it)")
    expect(done and "c" in writes.got and "error" not in box,
           "the save after a failed write was not written: the writer thread must survive a write's error and go on "
           "with the next save")
    done, box = _within(PATIENCE_S, _method(ck, "close"))
    expect(done, f"close() did not return within {PATIENCE_S:g} s")
    time.sleep(0.05)
    alive = [t for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    expect(not alive, f"close() left the writer thread running ({alive[0].name if alive else ''}): tell it to stop "
                      f"(a None in the queue) and join it")
    _real_file_round_trip(AsyncCheckpointer)
    return ("save() stages and returns, one writer thread writes in order, wait() waits and re-raises, close() stops "
            "the thread; a real checkpoint read back bit for bit")


def _real_file_round_trip(cls):
    """The learner's writer with the real write (serialise, write durably): the file read back equals the state at
    save time, bit for bit, though the state changed right after save()."""
    state = storage.recipe_state(4096 * 8, seed=5)
    snapshot = {k: v.clone() for k, v in state.items()}
    with storage.scratch_dir(64 * storage.MIB) as scratch:
        path = str(scratch / "checkpoint.pt")
        ck = cls(storage.save_checkpoint)
        ck.save(state, path)
        storage.train_step(state, 0.0)
        done, box = _within(30, ck.wait)
        close = getattr(ck, "close", None)
        if callable(close):
            close()
        expect(done and "error" not in box, f"wait() on a real checkpoint did not finish cleanly: {box.get('error')}")
        bad = storage.bitwise_mismatches(torch.load(path, weights_only=True), snapshot)
        expect(not bad, f"the real checkpoint read back differs from the state at save time in {', '.join(bad)}")

import math

import pytest

from common.core.checks import CheckFailed
from common.exercises import lab11
from common.systems.host import sharing
from common.systems.inference import kvcache


def _stub(*a):
    raise NotImplementedError("Exercise 11.x")


def test_kv_bytes_per_token():
    assert lab11.check_kv_bytes_per_token(lambda l, h, kv, d, b: l * kv * 2 * d * b).passed
    with pytest.raises(CheckFailed, match="all .* query heads"):
        lab11.check_kv_bytes_per_token(lambda l, h, kv, d, b: l * h * 2 * d * b)
    with pytest.raises(CheckFailed, match="both K and V"):
        lab11.check_kv_bytes_per_token(lambda l, h, kv, d, b: l * kv * d * b)
    with pytest.raises(CheckFailed, match="one layer"):
        lab11.check_kv_bytes_per_token(lambda l, h, kv, d, b: kv * 2 * d * b)
    assert lab11.check_kv_bytes_per_token(_stub).status == "not attempted"


def test_mla_bytes_per_token():
    assert lab11.check_mla_bytes_per_token(lambda l, r, p, b: l * (r + p) * b).passed
    with pytest.raises(CheckFailed, match="RoPE key"):
        lab11.check_mla_bytes_per_token(lambda l, r, p, b: l * r * b)
    with pytest.raises(CheckFailed, match="ONE latent"):
        lab11.check_mla_bytes_per_token(lambda l, r, p, b: 2 * l * (r + p) * b)
    with pytest.raises(CheckFailed, match="MLA bytes per token"):
        lab11.check_mla_bytes_per_token(lambda l, r, p, b: 128 * l * (r + p) * b)
    assert lab11.check_mla_bytes_per_token(_stub).status == "not attempted"


def test_paged_waste():
    assert lab11.check_paged_waste(lambda ls, b: sum(math.ceil(n / b) * b - n for n in ls)).passed
    with pytest.raises(CheckFailed, match="exact multiple"):
        lab11.check_paged_waste(lambda ls, b: sum((n // b + 1) * b - n for n in ls))
    with pytest.raises(CheckFailed, match="EMPTY slots"):
        lab11.check_paged_waste(lambda ls, b: sum(n % b for n in ls))
    with pytest.raises(CheckFailed, match="expected"):
        lab11.check_paged_waste(lambda ls, b: sum((n // b) * b - n for n in ls))
    assert lab11.check_paged_waste(_stub).status == "not attempted"


def _shared(d, n, m):
    if m == "time-slicing":
        return d
    if m == "mig":
        return min(n, 7) * min(d, 1 / 7)
    return min(1.0, n * d)


def test_shared_utilisation():
    with pytest.raises(CheckFailed, match="passed common.systems.host.sharing.shared_utilisation itself"):
        lab11.check_shared_utilisation(sharing.shared_utilisation)
    assert lab11.check_shared_utilisation(_shared).passed

    def mig_uncapped(d, n, m):
        return min(n, 7) * d if m == "mig" else _shared(d, n, m)

    def mig_unlimited(d, n, m):
        return n * min(d, 1 / 7) if m == "mig" else _shared(d, n, m)

    def mps_uncapped(d, n, m):
        return n * d if m == "mps" else _shared(d, n, m)

    def slicing_adds(d, n, m):
        return min(1.0, n * d) if m == "time-slicing" else _shared(d, n, m)

    for wrong, match in [(mig_uncapped, "hard slice"), (mig_unlimited, "at most 7"), (mps_uncapped, "cannot exceed"),
                         (slicing_adds, "one context at a time")]:
        with pytest.raises(CheckFailed, match=match):
            lab11.check_shared_utilisation(wrong)
    assert lab11.check_shared_utilisation(_stub).status == "not attempted"


# ---- issue 12: the classes of holes
def test_kv_every_element_size_fixed_and_aliasing_broken():
    # a byte table that treats every value as 2 bytes fails on every call (1- and 4-byte cases are fixed)
    for _ in range(3):
        with pytest.raises(CheckFailed, match="fixed 2 bytes per value"):
            lab11.check_kv_bytes_per_token(lambda l, h, kv, d, b: l * kv * 2 * d * 2)
    # swapping layers and kv_heads is caught on the asymmetric first case: it must not pass as MHA's 32/32/32
    with pytest.raises(CheckFailed, match="bytes per token for layers=24"):
        lab11.check_kv_bytes_per_token(lambda l, h, kv, d, b: kv * kv * 2 * d * b)
    with pytest.raises(CheckFailed, match="count of values, not bytes"):
        lab11.check_kv_bytes_per_token(lambda l, h, kv, d, b: l * kv * 2 * d)
    with pytest.raises(CheckFailed, match=r"kv_bytes_per_token\(24, 32, 8, 128, 2\): your code raised KeyError"):
        lab11.check_kv_bytes_per_token(lambda *a: {}["x"])
    with pytest.raises(CheckFailed, match="returned list"):
        lab11.check_kv_bytes_per_token(lambda *a: [1])


def test_mla_one_layer_and_bytes():
    with pytest.raises(CheckFailed, match="one layer"):
        lab11.check_mla_bytes_per_token(lambda l, r, p, b: (r + p) * b)
    with pytest.raises(CheckFailed, match="count of values"):
        lab11.check_mla_bytes_per_token(lambda l, r, p, b: l * (r + p))


def test_paged_waste_input_untouched_and_all_sequences():
    def sorts_in_place(ls, b):
        ls.sort()
        return sum(math.ceil(n / b) * b - n for n in ls)
    with pytest.raises(CheckFailed, match="changed the list"):
        lab11.check_paged_waste(sorts_in_place)
    with pytest.raises(CheckFailed, match="first sequence only"):
        lab11.check_paged_waste(lambda ls, b: -ls[0] % b)
    with pytest.raises(CheckFailed, match=r"seed \d+"):
        lab11.check_paged_waste(lambda ls, b: sum(math.ceil(n / b) * b - n for n in ls) + 1)


def test_mig_whole_slice_named():
    def whole_slice(d, n, m):
        return min(n, 7) / 7 if m == "mig" else _shared(d, n, m)
    with pytest.raises(CheckFailed, match="not the whole slice"):
        lab11.check_shared_utilisation(whole_slice)


def test_calling_the_reference_is_caught():
    with pytest.raises(CheckFailed, match="called common.systems.inference.kvcache.kv_bytes_per_token"):
        lab11.check_kv_bytes_per_token(lambda l, h, kv, d, b: kvcache.kv_bytes_per_token(l, kv, d, d, b))
    with pytest.raises(CheckFailed, match="called common.systems.inference.kvcache.paged_waste"):
        lab11.check_paged_waste(lambda ls, b: kvcache.paged_waste(ls, b))


def test_failing_numbers_printed_with_enough_digits():
    from common.exercises.cases import expect_number
    # off by one in ~25 million: %.6g would print two equal numbers
    with pytest.raises(CheckFailed, match=r"expected 25165824, got 25165825"):
        expect_number(25165825, 25165824, "bytes", rtol=1e-12)


# ---- issue 28: checkpoint seconds from size, ranks and bandwidth
def _ckpt(size, ranks, nic, store):
    return max(size / ranks / (nic / 8), size / store)


def test_checkpoint_seconds():
    assert lab11.check_checkpoint_seconds(_ckpt).passed
    assert lab11.check_checkpoint_seconds(_stub).status == "not attempted"
    wrong = [
        (lambda s, r, n, st: max(s / r / n, s / st), "gigaBITS per second: divide by 8"),
        (lambda s, r, n, st: s / r / (n / 8), "shared by all .* writers: it caps their total"),
        (lambda s, r, n, st: s / st, "each rank's NIC .* also limits its share"),
        (lambda s, r, n, st: max(s / (n / 8), s / st), "write in parallel, each only its 1/.* share"),
        (lambda s, r, n, st: s / r / (n / 8) + s / st, "take the slower, not the sum"),
        (lambda s, r, n, st: s / (r * n / 8 + st), "bandwidths in series do not add"),
        (lambda s, r, n, st: min(s / r / (n / 8), s / st), "the FASTER of the two limits"),
        (lambda s, r, n, st: _ckpt(s, r, n, st) / 60, "minutes, not seconds"),
        (lambda s, r, n, st: _ckpt(s, r, n, st) * 1e9 / 2**30, "not GiB"),
        (lambda s, r, n, st: _ckpt(s, r, n, st) * 1.01, r"seconds for checkpoint_gb=6826.4.*relative error 0.01"),
    ]
    for fn, match in wrong:
        with pytest.raises(CheckFailed, match=match):
            lab11.check_checkpoint_seconds(fn)


def test_checkpoint_seconds_reference_and_bad_returns_caught():
    from common.systems import storage
    with pytest.raises(CheckFailed, match="called common.systems.storage.scale.checkpoint_seconds"):
        lab11.check_checkpoint_seconds(lambda *a: storage.checkpoint_seconds(*a))
    with pytest.raises(CheckFailed, match="returned None"):
        lab11.check_checkpoint_seconds(lambda *a: None)
    with pytest.raises(CheckFailed, match=r"checkpoint_seconds\(6826.4, 256, 200.0, 7256.8\): your code raised "
                                          r"ZeroDivisionError"):
        lab11.check_checkpoint_seconds(lambda *a: 1 / 0)


# ---- 11.5: a durable write
import os  # noqa: E402
import queue  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402


def _fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable(data, path, flush=True, fsync=True, rename=True, dir_sync="after", tmp_dir=None, sync_after=False,
            leave=False, leak=False):
    """The lab's solution, as a learner writes it, with one step changed at a time."""
    directory = os.path.dirname(os.path.abspath(path))
    if not rename:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(directory)
        return
    tmp = os.path.join(tmp_dir or directory, os.path.basename(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if flush:
            f.flush()
        if fsync and not sync_after:
            os.fsync(f.fileno())
    if dir_sync == "before":
        _fsync_dir(directory)
    if leave:
        shutil.copy(tmp, path)
    else:
        os.replace(tmp, path)
    if sync_after:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    if dir_sync == "after":
        if leak:
            os.fsync(os.open(directory, os.O_RDONLY))
        else:
            _fsync_dir(directory)


DURABLE_MISTAKES = [
    (lambda d, p: durable(d, p, fsync=False), r"never fsynced"),
    (lambda d, p: durable(d, p, flush=False), r"held 0 of the 100 bytes when you fsynced it.*f.flush\(\)"),
    (lambda d, p: durable(d, p, rename=False), r"written in place"),
    (lambda d, p: durable(d, p, dir_sync=None), r"directory was never fsynced"),
    (lambda d, p: durable(d, p, dir_sync="before"), r"directory was fsynced before the rename"),
    (lambda d, p: durable(d, p, tmp_dir=tempfile.gettempdir()), r"not in path's directory"),
    (lambda d, p: durable(d, p, sync_after=True), r"fsynced after the rename"),
    (lambda d, p: durable(d, p, leave=True), r"left behind .*checkpoint.pt.tmp"),
    (lambda d, p: durable(d, p, leak=True), r"file descriptor\(s\) left open"),
    (lambda d, p: open(p, "wb").write(d[:-1]), r"bytes that are not the"),
]


def test_write_durably_right_and_stub():
    assert lab11.check_write_durably(durable).passed
    assert lab11.check_write_durably(_stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", DURABLE_MISTAKES, ids=[m[:24] for _, m in DURABLE_MISTAKES])
def test_write_durably_mistakes_named(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        lab11.check_write_durably(wrong)


# ---- 11.6, the build exercise: an asynchronous checkpoint writer
class Writer:
    """The lab's solution, as a learner writes it; subclasses below change one thing each."""
    stop_on_error = False

    def __init__(self, write):
        self.write = write
        self.queue = queue.Queue()
        self.errors = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            item = self.queue.get()
            try:
                if item is None:
                    return
                self.write(*item)
            except BaseException as exc:
                self.errors.append(exc)
                if self.stop_on_error:
                    return
            finally:
                self.queue.task_done()

    def stage(self, state):
        return {k: v.detach().clone() for k, v in state.items()}

    def save(self, state, path):
        self.queue.put((self.stage(state), path))

    def wait(self):
        self.queue.join()
        if self.errors:
            raise self.errors.pop(0)

    def close(self):
        self.queue.put(None)
        self.thread.join()


class Synchronous(Writer):
    def save(self, state, path):
        self.write(self.stage(state), path)


class NotStaged(Writer):
    def stage(self, state):
        return state


class Shallow(Writer):
    def stage(self, state):
        return {k: v.detach() for k, v in state.items()}


class ThreadPerSave(Writer):
    def __init__(self, write):
        self.write, self.threads = write, []

    def save(self, state, path):
        self.threads.append(threading.Thread(target=self.write, args=(self.stage(state), path), daemon=True))
        self.threads[-1].start()

    def wait(self):
        for t in self.threads:
            t.join()

    def close(self):
        self.wait()


class NoWait(Writer):
    def wait(self):
        pass


class Swallowed(Writer):
    def wait(self):
        self.queue.join()


class DiesOnError(Writer):
    def _run(self):
        while True:
            item = self.queue.get()
            if item is None:
                return
            self.write(*item)
            self.queue.task_done()


class StopsAfterError(Writer):
    stop_on_error = True


class RaisesAgain(Writer):
    def wait(self):
        self.queue.join()
        if self.errors:
            raise self.errors[0]


class CloseLeavesThread(Writer):
    def close(self):
        pass


class NoClose(Writer):
    close = None


WRITER_MISTAKES = [  # (the wrong answer, the words that must name it): at least ten, as issue 42 asks
    (Synchronous, r"did not return while its write was still running"),
    (NotStaged, r"holds values changed after save\(\) returned"),
    (Shallow, r"holds values changed after save\(\) returned"),
    (ThreadPerSave, r"two writes ran at the same time"),
    (NoWait, r"after wait\(\) the writes done were"),
    (Swallowed, r"wait\(\) returned as if it had been saved"),
    (DiesOnError, r"wait\(\) did not return after a write failed"),
    (StopsAfterError, r"save after a failed write was not written"),
    (RaisesAgain, r"raised the old error again"),
    (CloseLeavesThread, r"close\(\) left the writer thread running"),
    (NoClose, r"has no close\(\) method"),
]


def test_async_checkpointer_right_and_stub():
    assert lab11.check_async_checkpointer(Writer).passed

    class Stub:
        def __init__(self, write):
            raise NotImplementedError("Exercise 11.6: replace this line with your code")
    assert lab11.check_async_checkpointer(Stub).status == "not attempted"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # DiesOnError's thread dies
@pytest.mark.parametrize("wrong, match", WRITER_MISTAKES, ids=[w.__name__ for w, _ in WRITER_MISTAKES])
def test_async_checkpointer_mistakes_named(wrong, match, monkeypatch):
    monkeypatch.setattr(lab11, "PATIENCE_S", 1.0)  # the wrong writers that hang are named after a second, not three
    with pytest.raises(CheckFailed, match=match):
        lab11.check_async_checkpointer(wrong)


def test_async_checkpointer_reference_is_caught():
    from common.systems import storage

    class Mine(storage.AsyncCheckpointer):
        pass
    with pytest.raises(CheckFailed, match="inherits storage.AsyncCheckpointer"):
        lab11.check_async_checkpointer(Mine)
    with pytest.raises(CheckFailed, match="the reference this exercise asks you to write"):
        lab11.check_async_checkpointer(storage.AsyncCheckpointer)


# ---- issue 46: right answers written differently pass; the library watch sees the workbook's writer wherever it sits
def test_right_answers_written_differently():
    def sharing_other(d, n, m):
        return {"time-slicing": d, "mig": min(n, 7) / 7 * min(7 * d, 1.0), "mps": min(n * d, 1.0)}[m]
    assert lab11.check_shared_utilisation(sharing_other).passed
    assert lab11.check_checkpoint_seconds(lambda s, r, n, st: s / min(r * n / 8, st)).passed

    class Cloned(Writer):  # stages with torch.clone
        def stage(self, state):
            import torch
            return {k: torch.clone(v.detach()) for k, v in state.items()}
    assert lab11.check_async_checkpointer(Cloned).passed

    def durable_pathlib(data, path):
        import pathlib
        target = pathlib.Path(path)
        tmp = target.with_name(target.name + ".partial")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data) if data else None
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, target)
        _fsync_dir(str(target.parent))
    assert lab11.check_write_durably(durable_pathlib).passed


def test_the_workbook_writer_inside_the_learners_class_is_refused():
    from common.systems import storage

    class Lazy(Writer):
        def save(self, state, path):
            storage.AsyncCheckpointer(self.write).save(state, path)
    with pytest.raises(CheckFailed, match=r"save\(\) called common.systems.storage.writer.AsyncCheckpointer"):
        lab11.check_async_checkpointer(Lazy)

"""Lab 11's named wrong answers (issue 46): for 11.4-11.7, beyond the three of each in test_wrong_answers_late.py --
look-alike sharing formulas that only some modes separate, every misstep of a durable write, the asynchronous writer's
races and lost errors, unit slips of checkpoint time, and cheats that call the workbook's own storage and sharing
code."""
import tempfile

from common.exercises import lab11
from common.systems import storage
from common.systems.host import sharing
from test_exercises_lab11 import (DURABLE_MISTAKES, CloseLeavesThread, NoClose, NoWait, RaisesAgain, Shallow, Writer,
                                  _ckpt, _shared, durable)


def _mode(d, n, m, **instead):
    return instead[m](d, n) if m in instead else _shared(d, n, m)


class Mine(storage.AsyncCheckpointer):
    """The workbook's writer, inherited."""


class Wrapped:
    """The workbook's writer, held inside the learner's class."""

    def __init__(self, write):
        self.inner = storage.AsyncCheckpointer(write)

    def save(self, state, path):
        self.inner.save(state, path)

    def wait(self):
        self.inner.wait()

    def close(self):
        self.inner.close()


class LazyWrapped(Wrapped):
    """The workbook's writer, made on the first save."""

    def __init__(self, write):
        self.write, self.inner = write, None

    def save(self, state, path):
        if self.inner is None:
            self.inner = storage.AsyncCheckpointer(self.write)
        self.inner.save(state, path)


WRONG = {
    lab11.check_shared_utilisation: [
        (lambda d, n, m: n * d if m == "mps" else _shared(d, n, m), "cannot exceed"),
        (lambda d, n, m: min(1.0, n * d) if m == "time-slicing" else _shared(d, n, m), "one context at a time"),
        (lambda d, n, m: _mode(d, n, m, **{"time-slicing": lambda d, n: d / n}), "not demand / n_jobs"),
        (lambda d, n, m: _mode(d, n, m, mig=lambda d, n: min(n, 8) * min(d, 1 / 8)), "not 8"),
        (lambda d, n, m: _mode(d, n, m, mps=lambda d, n: d), "their demands add up"),
        (lambda d, n, m: _mode(d, n, m, mig=lambda d, n: min(1.0, n * d)), "cannot use another's idle slice"),
        (lambda d, n, m: _mode(d, n, m, mig=lambda d, n: min(1.0, n * d), mps=lambda d, n: min(n, 7) * min(d, 1 / 7)),
         "MIG and MPS formulas are swapped"),
        (lambda d, n, m: _mode(d, n, m, mig=lambda d, n: min(n, 7) * d / 7), "not of a 1/7 MIG slice"),
        (lambda d, n, m: 100 * _shared(d, n, m), "that is a percentage"),
        (lambda d, n, m: sharing.shared_utilisation(d, n, m),
         "called common.systems.host.sharing.shared_utilisation, the reference"),
    ],
    lab11.check_write_durably: [(w, words) for w, words in DURABLE_MISTAKES] + [
        (lambda d, p: storage.write_durably(d, p), "called common.systems.storage.writer.write_durably"),
        (lambda d, p: durable(d, p, tmp_dir=tempfile.gettempdir()), "os.replace is atomic only within one file"),
    ],
    lab11.check_async_checkpointer: [
        (Shallow, "copy \\(stage\\) every tensor in save\\(\\)"),
        (NoWait, "after wait\\(\\) the writes done were"),
        (RaisesAgain, "raised the old error again"),
        (CloseLeavesThread, "close\\(\\) left the writer thread running"),
        (NoClose, "has no close\\(\\) method"),
        (Mine, "inherits storage.AsyncCheckpointer"),
        (storage.AsyncCheckpointer, "you passed storage.AsyncCheckpointer itself"),
        (Wrapped, "AsyncCheckpointer\\(write\\) called common.systems.storage.writer.AsyncCheckpointer"),
        (LazyWrapped, "your AsyncCheckpointer's save\\(\\) called common.systems.storage.writer.AsyncCheckpointer"),
    ],
    lab11.check_checkpoint_seconds: [
        (lambda s, r, n, st: s / (r * n / 8 + st), "bandwidths in series do not add"),
        (lambda s, r, n, st: min(s / r / (n / 8), s / st), "the FASTER of the two limits"),
        (lambda s, r, n, st: _ckpt(s, r, n, st) / 60, "minutes, not seconds"),
        (lambda s, r, n, st: _ckpt(s, r, n, st) * 1e9 / 2**30, "not GiB"),
        (lambda s, r, n, st: s / st, "each rank's NIC .* also limits its share"),
        (lambda s, r, n, st: max(s / (n / 8), s / st), "write in parallel, each only its 1/.* share"),
        (lambda s, r, n, st: max(s / r / (n * 8), s / st), "you multiplied the Gbps by 8"),
        (lambda s, r, n, st: max(s / r / (n / 8), s / (st / 8)), "storage_gbs is already GB/s"),
        (lambda s, r, n, st: storage.checkpoint_seconds(s, r, n, st),
         "called common.systems.storage.scale.checkpoint_seconds, the reference"),
        (lambda s, r, n, st: max(s / r / storage.gbps_to_bytes(n) * 1e9, s / st),
         "called common.systems.storage.scale.gbps_to_bytes, the workbook's own code"),
    ],
}
assert Writer  # the right writer these change one thing of

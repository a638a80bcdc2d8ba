"""Checkpoints a trainer writes itself: serialised in memory, written durably, written in the background -- lab 11's
exercises 11.5 and 11.6 (these are their references) -- and measured against the blocking save.

- `to_bytes(state)`: `torch.save` into memory: the serialiser's cost alone, no disk.
- `write_durably(data, path)`: the bytes into a temporary file in `path`'s directory, flushed and fsynced, renamed
  over `path` (`os.replace`, atomic: a reader sees the old file or the new one, never half of one), then the
  directory fsynced (the rename is an entry of the directory, durable only once the directory is). The temporary
  file is removed if anything fails.
- `save_checkpoint(state, path)`: both, in the caller's thread: the blocking save.
- `AsyncCheckpointer(write)`: `save(state, path)` stages a copy of every tensor and returns; ONE background thread
  writes the staged saves in the order they were asked for (a queue); `wait()` blocks until every save so far is
  durable and re-raises a writer's error; `close()` stops the thread.
- `measure_checkpoints`: per round, a blocking save (serialise, then write durably: the two rates), the training
  steps alone, and an asynchronous save overlapped with the same steps. The write's exposed seconds are
  t_overlap - t_steps, unclipped (noise can make them negative, a slow round larger than the blocking save); the
  staging seconds are kept apart. Every asynchronous checkpoint is read back and compared bit for bit with the state
  as it was when its save began: the steps change every tensor in place while the write runs.
"""
from __future__ import annotations

import io
import os
import queue
import statistics
import threading
import time
from pathlib import Path

import torch

from common.core.validate import number, whole
from common.systems.storage.checkpoints import bitwise_mismatches, recipe_state, state_bytes
from common.systems.storage.files import MIB, Scratch, disk_full_is_clear


def to_bytes(state: dict) -> bytes:
    """`torch.save(state)` into memory."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def write_durably(data: bytes, path: str | Path) -> None:
    """`data` into `path` so that it survives a crash and no reader sees half of it (see the module docstring)."""
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        with disk_full_is_clear(path), open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(state: dict, path: str | Path) -> dict:
    """The blocking save: serialise, then write durably. Seconds of each and the bytes written."""
    t0 = time.perf_counter()
    data = to_bytes(state)
    t1 = time.perf_counter()
    write_durably(data, path)
    return {"serialize_s": t1 - t0, "disk_s": time.perf_counter() - t1, "nbytes": len(data)}


class AsyncCheckpointer:
    """Checkpoints written by one background thread, in the order they were asked for (see the module docstring)."""

    def __init__(self, write=save_checkpoint):
        self._write = write
        self._queue: queue.Queue = queue.Queue()
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            except BaseException as exc:  # kept for wait(), which re-raises it in the training thread
                self._errors.append(exc)
            finally:
                self._queue.task_done()

    def save(self, state: dict, path: str | Path) -> None:
        """Stage a copy of every tensor (the caller may change its tensors as soon as this returns), queue the write."""
        staged = {k: v.detach().clone() for k, v in state.items()}
        self._queue.put((staged, path))

    def wait(self) -> None:
        """Block until every save asked for so far is durable; re-raise the first error a write raised."""
        self._queue.join()
        if self._errors:
            raise self._errors.pop(0)

    def close(self) -> None:
        """Finish the queued saves and stop the writer thread."""
        self._queue.put(None)
        self._thread.join()


# ---------------------------------------------------------------- the measurement

def train_step(state: dict, device_s: float) -> None:
    """One training step as the host sees it: the accelerator's time, during which the host thread only waits (a
    sleep, as section 1's loader step), then an in-place change of every tensor of the state (weight decay on the
    FP32 master and the moments, the BF16 weights copied from the master)."""
    time.sleep(device_s)
    for key in [k for k in state if k.endswith(".master")]:
        layer = key[: -len("master")]
        master = state[key].mul_(1 - 1e-3)
        state[layer + "weight"].copy_(master)
        state[layer + "exp_avg"].mul_(0.9)
        state[layer + "exp_avg_sq"].mul_(0.99)  # a BF16 ulp is 2^-8: 0.999 would change nothing


def measure_checkpoints(scratch: Scratch, params: int, rounds: int = 5, step_ms: float = 40.0,
                        checkpointer=AsyncCheckpointer, seed: int = 0) -> dict:
    """`rounds` rounds of: a blocking save (serialise, write durably), `n` training steps alone, and
    `checkpointer(save_checkpoint)`'s save overlapped with the same `n` steps then waited for; `n` covers about 1.5
    times a first blocking save (at most MAX_STEPS), on one torch thread. Returns the rounds (seconds), the rates of serialising and of writing, the median
    exposed and staging seconds, every asynchronous checkpoint's bit-for-bit verdict, and how much the steps alone
    varied between rounds (`steps_spread_s`, their interquartile range: an exposed time smaller than that cannot be
    told from noise). A first round warms the writer and the steps up and is not counted."""
    whole("params", params, 1024, meaning="at least one row of 1024 columns")
    whole("rounds", rounds)
    number("step_ms", step_ms, meaning="milliseconds the accelerator takes per step")
    state = recipe_state(params, seed)
    nbytes = state_bytes(state)
    scratch.reserve(2 * nbytes + MIB, "checkpoints")  # one file and its temporary at a time, plus torch's records
    path = scratch / "checkpoint.pt"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the steps' in-place updates are small: on a busy machine a parallel op's barrier would
    try:                      # wait for a thread pushed off its core, and the steps would measure the other processes
        first = save_checkpoint(state, path)
        n_steps = min(MAX_STEPS, max(3, round(1.5 * (first["serialize_s"] + first["disk_s"]) / (step_ms / 1e3))))
        return _rounds(state, path, nbytes, first, n_steps, rounds, step_ms, checkpointer)
    finally:
        torch.set_num_threads(threads)


MAX_STEPS = 20  # steps per overlap: a slow disk makes the write outlast them, and the exposed time says so


def _rounds(state, path, nbytes, first, n_steps, rounds, step_ms, checkpointer) -> dict:
    writer = checkpointer(save_checkpoint)
    rows, mismatches = [], []
    try:
        for i in range(rounds + 1):  # the first round warms the writer thread and the steps up: not counted
            blocking = save_checkpoint(state, path)
            t = time.perf_counter()
            for _ in range(n_steps):
                train_step(state, step_ms / 1e3)
            t_steps = time.perf_counter() - t
            snapshot = {k: v.clone() for k, v in state.items()}
            t = time.perf_counter()
            writer.save(state, path)
            t_stage = time.perf_counter() - t
            for _ in range(n_steps):
                train_step(state, step_ms / 1e3)
            writer.wait()
            t_overlap = time.perf_counter() - t
            if i == 0:
                continue
            mismatches.append(bitwise_mismatches(torch.load(path, weights_only=True), snapshot))
            rows.append({"blocking_s": blocking["serialize_s"] + blocking["disk_s"], **blocking, "steps_s": t_steps,
                         "stage_s": t_stage, "overlap_s": t_overlap, "exposed_s": t_overlap - t_steps})
    finally:
        close = getattr(writer, "close", None)
        if close is not None:
            close()
    med = {k: statistics.median(r[k] for r in rows) for k in ("blocking_s", "serialize_s", "disk_s", "stage_s",
                                                             "exposed_s", "steps_s")}
    return {"rounds": rows, "state_bytes": nbytes, "file_bytes": first["nbytes"], "n_steps": n_steps,
            "serialize_gbps": first["nbytes"] / med["serialize_s"] / 1e9,
            "disk_gbps": first["nbytes"] / med["disk_s"] / 1e9, "median": med, "mismatches": mismatches,
            "steps_spread_s": _iqr([r["steps_s"] for r in rows])}


def _iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [0.0, 0.0, 0.0]
    return q[2] - q[0]

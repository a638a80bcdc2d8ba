"""Labs 07-08 and 11-13: each checker's three most likely wrong answers, and the words that name each one (see
test_wrong_answers.py). 13.1 is another change's; 7.3's and 7.5's named mistakes live in their lab test files. Lab 06's
are in tests/wrong_answers/lab06.py."""
import functools
import math

import pytest
import torch
from learner import own_copy

from common.exercises import lab07, lab08, lab11, lab12, lab13
from common.moe import moe
from test_wrong_answers import run_named

def _durable(data, path, **wrong):
    from test_exercises_lab11 import durable
    return durable(data, path, **wrong)


def _writer(name):
    import test_exercises_lab11
    return getattr(test_exercises_lab11, name)


def _guard(*args, **kwargs):
    from test_exercises_lab12 import guard
    return guard(*args, **kwargs)


def _mask_loop(*args):
    from test_exercises_lab12 import _mask_loop as loop
    return loop(*args)


def _sorted(x, weights, indices, w_gate, w_up, w_down, act, split=True):
    plan = moe.dispatch_plan(indices, w_gate.shape[0])
    ws = (w_gate.unbind(0), w_up.unbind(0), w_down.unbind(0)) if split else (w_gate, w_up, w_down)
    outs = [act(r @ ws[0][e], r @ ws[1][e]) @ ws[2][e]
            for e, r in enumerate(moe.dispatch(x, plan).split(plan.counts.tolist()))]
    return moe.combine(torch.cat(outs), plan, weights, indices.shape[0])


def _layer(cfg, tokens, kit, **mistake):
    from common.exercises import layer_model
    return layer_model.reference(cfg, tokens, kit, **mistake)

EXPERT = lambda h, f: 3 * h * f  # noqa: E731


def _ring(n, p, a, bw):
    return 2 * (p - 1) * a + 2 * (p - 1) / p * n / bw if p > 1 else 0.0


def _allreduce(alg, n, p, a, bw, mistake=None):
    if p == 1:
        return 0.0
    lg = math.ceil(math.log2(p))
    if alg == "ring":
        if mistake == "rs":
            return (p - 1) * a + (p - 1) / p * n / bw
        if mistake == "whole":
            return 2 * (p - 1) * (a + n / bw)
        return _ring(n, p, a, bw)
    if alg == "tree":
        return (lg if mistake == "up" else 2 * lg) * (a + n / bw)
    return ((2 * lg) if mistake == "rd_bcast" else lg) * (a + n / bw)


def _fit(sizes, times, p, relative=True, divide=True, slope=False):
    import numpy as np
    s, t = np.asarray(sizes, float), np.asarray(times, float)
    a = np.stack([np.full(len(s), 2.0 * (p - 1) if divide else 1.0), 2 * (p - 1) / p * s], 1)
    w = 1 / t if relative else np.ones_like(t)
    x, *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    return float(x[0]), float(x[1] if slope else 1 / x[1])


def _order(pp, m, s, warm=None, gpipe=False):
    if gpipe:
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    w = min(pp - 1 - s if warm is None else warm, m)
    out = [("F", j) for j in range(w)]
    f, b = w, 0
    while b < m:
        if f < m:
            out.append(("F", f))
            f += 1
        out.append(("B", b))
        b += 1
    return out


WRONG = {
    # ------------------------------------------------------------------------------------------- lab 07
    lab07.check_allreduce_time: [
        (lambda alg, n, p, a, bw: _allreduce(alg, n, p, a, bw, "rs"), "reduce-scatter"),
        (lambda alg, n, p, a, bw: _allreduce(alg, n, p, a, bw, "whole"), "one chunk of n/p bytes"),
        (lambda alg, n, p, a, bw: _allreduce(alg, n, p, a, bw, "up"), "come back down"),
    ],
    lab07.check_bus_factor: [
        (lambda c, p: 1.0 if c == "all_reduce" else ((p - 1) / p if c != "broadcast" else 1.0), "at p = 2 only"),
        (lambda c, p: 2 * (p - 1) / p if c != "broadcast" else 1.0, "belongs to the all-reduce only"),
        (lambda c, p: (p / (2 * (p - 1)) if c == "all_reduce" else p / (p - 1)) if c != "broadcast" else 1.0,
         "upside down"),
    ],
    lab07.check_fit_alpha_beta: [
        (lambda s, t, p: _fit(s, t, p, relative=False), "absolute"),
        (lambda s, t, p: _fit(s, t, p, divide=False), "2\\(p-1\\)|2 \\* \\(p - 1\\)|2\\(p - 1\\)"),
        (lambda s, t, p: _fit(s, t, p, slope=True), "slope"),
    ],
    # ------------------------------------------------------------------------------------------- lab 08
    lab08.check_one_f_one_b_order: [
        (lambda pp, m, s: _order(pp, m, s, gpipe=True), "that is GPipe"),
        (lambda pp, m, s: _order(pp, m, s, warm=pp - s), "too many warm-up forwards"),
        (lambda pp, m, s: _order(pp, m, s, warm=0), "only .* micro-batches in flight"),
    ],
    # ------------------------------------------------------------------------------------------- lab 11
    lab11.check_kv_bytes_per_token: [
        (lambda L, h, kv, d, b: L * h * 2 * d * b, "all .* query heads"),
        (lambda L, h, kv, d, b: L * kv * d * b, "both K and V are cached"),
        (lambda L, h, kv, d, b: 2 * kv * d * b, "one layer"),
    ],
    lab11.check_mla_bytes_per_token: [
        (lambda L, r, rope, b: L * r * b, "left out the decoupled RoPE key"),
        (lambda L, r, rope, b: L * (2 * r + rope) * b, "ONE latent"),
        (lambda L, r, rope, b: (r + rope) * b, "one layer"),
    ],
    lab11.check_paged_waste: [
        (lambda lengths, b: sum((n // b + 1) * b - n for n in lengths), "n // block \\+ 1"),
        (lambda lengths, b: sum(n % b for n in lengths), "EMPTY slots"),
        (lambda lengths, b: -lengths[0] % b, "first sequence only"),
    ],
    lab11.check_shared_utilisation: [
        (lambda d, n, mode: min(n, 7) * d if mode == "mig" else _share(d, n, mode), "hard slice of 1/7"),
        (lambda d, n, mode: n * min(d, 1 / 7) if mode == "mig" else _share(d, n, mode), "at most 7 MIG instances"),
        (lambda d, n, mode: min(n, 7) / 7 if mode == "mig" else _share(d, n, mode), "not the whole slice"),
    ],
    lab11.check_write_durably: [
        (lambda d, p: _durable(d, p, fsync=False), "never fsynced"),
        (lambda d, p: _durable(d, p, flush=False), "f.flush\\(\\) before os.fsync"),
        (lambda d, p: _durable(d, p, rename=False), "written in place"),
    ],
    lab11.check_async_checkpointer: [  # the build exercise: its other named mistakes are in test_exercises_lab11.py
        (_writer("NotStaged"), "holds values changed after save\\(\\) returned"),
        (_writer("ThreadPerSave"), "two writes ran at the same time"),
        (_writer("Swallowed"), "wait\\(\\) returned as if it had been saved"),
    ],
    lab11.check_checkpoint_seconds: [
        (lambda size, r, nic, store: max(size / r / nic, size / store), "gigaBITS per second"),
        (lambda size, r, nic, store: size / r / (nic / 8), "shared by all .* writers"),
        (lambda size, r, nic, store: size / r / (nic / 8) + size / store, "take the slower, not the sum"),
    ],
    # ------------------------------------------------------------------------------------------- lab 12 (12.1)
    lab12.check_idle_share: [
        (lambda ev, w: 100 * _idle(ev, w), "a percentage"),
        (lambda ev, w: 1 - _idle(ev, w), "the BUSY share"),
        (lambda ev, w: 1 - sum(min(e["ts"] + e["dur"], w[1]) - max(e["ts"], w[0]) for e in ev
                               if e["ts"] + e["dur"] > w[0] and e["ts"] < w[1]) / (w[1] - w[0]),
         "counted twice"),
    ],
    # ------------------------------------------------------------------------------------------- lab 12 (12.4, 12.5)
    lab12.check_keep_or_revert: [
        (functools.partial(_guard, synced=False), "still queued"),
        (functools.partial(_guard, order="fixed"), "order at random"),
        (functools.partial(_guard, rule="median"), "kept on the median"),
    ],
    lab12.check_moe_sorted_forward: [
        (_mask_loop, "boolean masks"),
        (functools.partial(_sorted, split=False), "unbind"),
        (lambda x, w, i, *ws: _sorted(x, torch.ones_like(w), i, *ws), "gate weight"),
    ],
    # ------------------------------------------------------------------------------------------- lab 13
    lab13.check_layer_seconds: [
        (functools.partial(_layer, sparse_peak=True), "SPARSE peak"),
        (functools.partial(_layer, fp8_for_bf16=True), "at DeepGEMM's FP8 rate"),
        (lambda cfg, tokens, kit: dict.fromkeys(("forward", "backward"), _layer(cfg, tokens, kit)["forward"]),
         "backward = forward"),
    ],
    lab13.check_exposed_all_to_all: [
        (lambda F, B, cf, cb, ov: (cf + cb - F - B) if ov else cf + cb, "negative"),
        (lambda F, B, cf, cb, ov: cf + cb, "no overlap counted"),
        (lambda F, B, cf, cb, ov: (max(0.0, cf - B) + max(0.0, cb - F)) if ov else cf + cb,
         "behind the other pass's compute separately"),
    ],
    lab13.check_gpu_hours: [
        (lambda s, g, t: s * g * 1e12 / t, "GPU-seconds"),
        (lambda s, g, t: s * 1e12 / t / 3600, "wall-clock hours"),
        (lambda s, g, t: s * g / t / 3600, "per token"),
    ],
}


def _share(d, n, mode):
    from common.systems.host import sharing
    own = own_copy(sharing.shared_utilisation)
    return own(d, n, mode)


def _idle(events, window):
    lo, hi = window
    spans = sorted((max(e["ts"], lo), min(e["ts"] + e["dur"], hi)) for e in events if e["ts"] + e["dur"] > lo
                   and e["ts"] < hi)
    busy, end = 0.0, lo
    for s, t in spans:
        if t > end:
            busy += t - max(s, end)
            end = t
    return 1 - busy / (hi - lo)


CASES = [(check, i, wrong, words) for check, answers in WRONG.items() for i, (wrong, words) in enumerate(answers)]


@pytest.mark.parametrize("check, i, wrong, words", CASES, ids=[f"{c.exercise}-{i}" for c, i, _, _ in CASES])
def test_wrong_answer_is_named(check, i, wrong, words):
    run_named(check, wrong, words)


"""The stages one rank holds and the work items on them (F, B, Bi, W), with the bytes of activations they keep.

`LiveBytes` counts what is really alive, not what a schedule says should be: every tensor autograd saves for a
backward (`saved_tensors_hooks`) and every tensor a queued weight pass keeps (its layer input and output gradient)
is tracked with a weak reference, and counted for as long as it lives. A full backward `B` frees a micro-batch's
tensors; a zero-bubble `Bi` frees most of them but leaves the weight pass its inputs and gradients until `W`.

On a GPU each stage the rank holds runs on a CUDA stream of its own (a backward runs on its forward's stream, as
autograd does), so the two halves of DualPipe's F&B pair -- a forward of one stage, a backward of the other -- are
queued on two streams and can overlap; on a CPU they run one after the other.
"""
from __future__ import annotations

import weakref

from common.parallel.pipeline_run.model import WeightGradStore, loss_of, stage_forward


class LiveBytes:
    """The bytes of the tracked tensors that are still alive (each distinct piece of memory once); `peak` is the
    largest `sample()` seen."""

    def __init__(self, exclude=()):
        self.refs: list = []
        self.exclude = {id(t) for t in exclude}  # parameters: memory of the model, not of activations
        self.peak = 0

    def track(self, t):
        if id(t) not in self.exclude:
            self.refs.append(weakref.ref(t))
        return t

    def now(self) -> int:
        alive = [t for t in (r() for r in self.refs) if t is not None]
        self.refs = [weakref.ref(t) for t in alive]
        return sum(n for _, n in {(t.data_ptr(), t.numel() * t.element_size()) for t in alive})

    def sample(self) -> int:
        self.peak = max(self.peak, self.now())
        return self.peak


class Stage:
    """The stages of the model that rank `rank` holds under `schedule`, with fresh copies of their weights, and the
    micro-batches of one step. `run(item, received)` does one work item and returns what it sends: a forward's
    output for the next stage, an input gradient for the previous one, or None."""

    def __init__(self, schedule, rank: int, model: list, x_all, t_all, device):
        import torch
        stages, m = schedule.stages, schedule.micro_batches
        per = len(model) // stages
        self.schedule, self.rank, self.device = schedule, rank, device
        self.params = {key: [[t.clone().to(device).requires_grad_() for t in blk]
                             for blk in model[key[1] * per:(key[1] + 1) * per]]
                       for key, dev in schedule.placement.items() if dev == rank}
        self.rows = len(x_all) // (m * schedule.directions)
        self.x_all, self.t_all = x_all.to(device), t_all.to(device)
        self.new_step()
        self.store = WeightGradStore(on_defer=lambda tensors: [self.live.track(t) for t in tensors])
        self.held: dict = {}  # (d, s, j) -> (input, output or loss) until the backward
        self.streams = {key: torch.cuda.Stream(device) for key in self.params} if device.type == "cuda" else {}
        self._torch = torch

    def new_step(self) -> None:
        """Gradients to None, activation count to zero, no loss yet."""
        self.losses = []  # the last stage's micro-batch losses (they add up to the batch's)
        self.live = LiveBytes([t for blks in self.params.values() for blk in blks for t in blk])
        for blks in self.params.values():
            for blk in blks:
                for t in blk:
                    t.grad = None

    def _rows(self, d: int, j: int) -> slice:
        k = d * self.schedule.micro_batches + j
        return slice(k * self.rows, (k + 1) * self.rows)

    def run(self, item, received=None):
        kind, d, s, j = item
        last = s == self.schedule.stages - 1
        if kind == "F":
            x = self.x_all[self._rows(d, j)] if s == 0 else received.requires_grad_()
            with self._torch.autograd.graph.saved_tensors_hooks(self.live.track, lambda t: t):
                y = stage_forward(self.params[(d, s)], x, self.store)
            if last:
                y = loss_of(y, self.t_all[self._rows(d, j)], len(self.x_all))
                self.losses.append(y.detach())  # a tensor: reading it on a GPU would wait for the device
            self.held[(d, s, j)] = (x, y)
            out = None if last else y.detach()
        elif kind in ("B", "Bi"):
            x, y = self.held.pop((d, s, j))
            self.store.deferring = (d, s, j) if kind == "Bi" else None
            try:  # the sum of y * dL/dy has the gradient dL/dy: the same as y.backward(dL/dy), without the
                (y if last else (y * received).sum()).backward()  # import of sympy a tensor argument costs a rank
            finally:
                self.store.deferring = None
            out = x.grad if s > 0 else None
            del x, y
        else:
            self.store.run((d, s, j))
            out = None
        self.live.sample()
        return out

    def run_op(self, op, inputs: list) -> list:
        """Run an op's items (one, or an F&B pair) with their received inputs; what each sends. On a GPU each item
        runs on its stage's stream, the rank's stream waiting for both at the end."""
        if not self.streams:
            return [self.run(item, x) for item, x in zip(op, inputs)]
        torch = self._torch
        here = torch.cuda.current_stream(self.device)
        used, outs = [], []
        for item, x in zip(op, inputs):
            stream = self.streams[item[1:3]]
            stream.wait_stream(here)
            if x is not None:
                x.record_stream(stream)
            with torch.cuda.stream(stream):
                outs.append(self.run(item, x))
            used.append(stream)
        for stream in used:
            here.wait_stream(stream)
        return outs

    def copies(self):
        """(direction, stage, index of the block in the model, its 4 tensors) for every block this rank holds."""
        per = len(next(iter(self.params.values())))
        for (d, s), blks in sorted(self.params.items()):
            for i, blk in enumerate(blks):
                yield d, s, s * per + i, blk

    def flat_grads(self):
        """This rank's gradients, flat, block by block in the model's order (the same order on DualPipe's two
        mirrored ranks, which hold the same stages in opposite directions)."""
        return self._torch.cat([t.grad.reshape(-1) for *_, blk in sorted(self.copies(), key=lambda c: c[2])
                                for t in blk])

    def set_flat_grads(self, flat) -> None:
        offset = 0
        for *_, blk in sorted(self.copies(), key=lambda c: c[2]):
            for t in blk:
                t.grad.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()

    def sgd(self, lr: float) -> None:
        """One optimizer step: w <- w - lr * grad, for every tensor this rank holds."""
        with self._torch.no_grad():
            for *_, blk in self.copies():
                for t in blk:
                    t.sub_(lr * t.grad)

    def errors(self, model: list, reference: list, lr: float) -> tuple:
        """(gradient error, weight error): the largest difference of any copy this rank holds from one process's
        gradient (`reference`, per block) and from the weights one SGD step from `model` with it gives."""
        g_err = w_err = 0.0
        for _, _, b, blk in self.copies():
            for t, w0, g in zip(blk, model[b], reference[b]):
                g_err = max(g_err, float((t.grad.detach().cpu() - g).abs().max()))
                w_err = max(w_err, float((t.detach().cpu() - (w0 - lr * g)).abs().max()))
        return g_err, w_err

    def stage_bytes(self) -> int:
        """The activation bytes one micro-batch leaves saved in one stage (the simulator's memory unit)."""
        live = LiveBytes([t for blks in self.params.values() for blk in blks for t in blk])
        x = self._torch.zeros(self.rows, self.x_all.shape[1], device=self.device, requires_grad=True)
        with self._torch.autograd.graph.saved_tensors_hooks(live.track, lambda t: t):
            y = stage_forward(next(iter(self.params.values())), x)
        nbytes = live.now()
        del y
        return nbytes

    def gradient(self, blocks: int):
        """The whole model's gradient, flat, on the CPU, as this rank holds it in direction 0 (every stage once;
        DualPipe's direction-1 copies are their mirrors'), zeros elsewhere -- a sum over the ranks gives it whole."""
        torch = self._torch
        shapes = [t.shape for t in next(iter(self.params.values()))[0]]
        full = [[torch.zeros(shape) for shape in shapes] for _ in range(blocks)]
        for d, _, b, blk in self.copies():
            if d == 0:
                for k, t in enumerate(blk):
                    full[b][k] += t.grad.detach().cpu()
        return torch.cat([g.flatten() for blk in full for g in blk])

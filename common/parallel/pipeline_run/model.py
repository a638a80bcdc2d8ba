"""The model the pipeline executor cuts into stages: residual MLP blocks x + W2 tanh(W1 x + b1) + b2 (float32), whose
linear layers can defer their weight gradients -- the zero-bubble split of the backward into `Bi` (input gradients
now) and `W` (weight gradients later), as DualPipe's `WeightGradStore` does."""
from __future__ import annotations


def make_model(blocks: int, hidden: int, seed: int = 0) -> list:
    """`blocks` x (W1, b1, W2, b2), the same weights for a given seed on every rank."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    scale = hidden ** -0.5
    return [(torch.randn(hidden, hidden, generator=gen) * scale, torch.zeros(hidden),
             torch.randn(hidden, hidden, generator=gen) * scale, torch.zeros(hidden)) for _ in range(blocks)]


def make_batch(batch: int, hidden: int, seed: int = 1):
    """Inputs and targets of one step (synthetic, seeded)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, hidden, generator=gen), torch.randn(batch, hidden, generator=gen)


class WeightGradStore:
    """A stage's deferred weight gradients. While `deferring` holds a key (a `Bi` runs), each linear layer's
    backward queues its weight part under that key instead of computing it; `run(key)` (the matching `W`) computes
    them. `on_defer(tensors)` is told of the tensors a queued part keeps alive (its input and output gradient).
    `linear` is the store's own autograd Function (made here, as torch is imported only when a store is)."""

    def __init__(self, on_defer=None):
        self.deferring = None
        self.pending: dict = {}
        self.on_defer = on_defer or (lambda tensors: None)
        self.linear = _deferrable_linear(self)

    def run(self, key) -> None:
        parts = self.pending.pop(key)
        while parts:
            parts.pop()()  # popped, so that each part's tensors are freed as soon as it has run


def _deferrable_linear(store: WeightGradStore):
    """x @ w.T + b as an autograd Function whose weight gradients go to `store` while it is deferring."""
    import torch

    class DeferrableLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            ctx.save_for_backward(x)
            ctx.weight, ctx.bias = w, b
            return torch.addmm(b, x, w.t())

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            w, b = ctx.weight, ctx.bias
            if store.deferring is None:
                return g @ w, g.t() @ x, g.sum(0)

            def weight_part():
                with torch.no_grad():
                    accumulate(w, g.t() @ x)
                    accumulate(b, g.sum(0))
            store.pending.setdefault(store.deferring, []).append(weight_part)
            store.on_defer((x, g))
            return g @ w, None, None
    return DeferrableLinear


def linear(x, w, b, store: WeightGradStore):
    """x @ w.T + b whose weight gradients go to `store` while it is deferring (else are computed at once)."""
    return store.linear.apply(x, w, b)


def accumulate(p, grad) -> None:
    p.grad = grad.clone() if p.grad is None else p.grad + grad


def stage_forward(params: list, x, store: WeightGradStore | None = None):
    """Run the blocks of one stage: x <- x + W2 tanh(W1 x + b1) + b2 for each (W1, b1, W2, b2)."""
    import torch
    store = store or WeightGradStore()
    for w1, b1, w2, b2 in params:
        x = x + linear(torch.tanh(linear(x, w1, b1, store)), w2, b2, store)
    return x


def loss_of(y, target, total_rows: int):
    """Sum of squared errors over the whole batch / rows: micro-batch losses add up to the full-batch loss."""
    return ((y - target) ** 2).sum() / total_rows


def reference_gradients(blocks: int, hidden: int, batch: int, seed: int = 0) -> list:
    """One process, the whole batch through the whole model: the gradient of every block's 4 tensors."""
    params = [[t.clone().requires_grad_() for t in blk] for blk in make_model(blocks, hidden, seed)]
    x, target = make_batch(batch, hidden, seed + 1)
    loss_of(stage_forward(params, x), target, batch).backward()
    return [[t.grad for t in blk] for blk in params]

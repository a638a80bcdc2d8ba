"""Lab 06's build exercise: an MoE layer's dispatch and combine for top-k routing -- sort the T*k assignments by
expert, run each expert once on its contiguous slice, undo the permutation, weight by the gate -- checked bit for
bit against the lab's reference (`moe.moe_grouped`) and for the gradient.

Bit for bit: the first cases use exact arithmetic (integer tokens, integer linear experts, gate weights that are
multiples of 1/8), where every right order of additions gives the same bits, so `torch.equal` judges and a wrong
permutation cannot hide in rounding. Then SwiGLU experts in float32, and the gradient of a random linear function of
the output with respect to the tokens and the gate weights, against autograd through the reference.

A wrong layer is named by its mistake: what each mistake computes is computed here, on the exact case, and matched.
"""
from __future__ import annotations

import math

import torch

from common.core.checks import expect, expect_close, fail
from common.exercises.cases import learner_call
from common.moe import moe


class LinearExperts:
    """E experts y = x @ W[e] with small integer weights: exact in float64 for small integer inputs."""

    def __init__(self, num_experts: int, hidden: int, gen):
        self.w = torch.randint(-3, 4, (num_experts, hidden, hidden), generator=gen).to(torch.float64)

    @property
    def num_experts(self) -> int:
        return self.w.shape[0]

    def forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w[e]


class CountingExperts:
    """Wraps experts and records each forward call's expert and row count (a grouped layer calls each expert at most
    once, on the rows routed to it)."""

    def __init__(self, experts):
        self._experts = experts
        self.calls: list[tuple[int, int]] = []
        self.num_experts = experts.num_experts

    def forward(self, e, x):
        self.calls.append((int(e), int(x.shape[0])))
        return self._experts.forward(e, x)


def _routing(t: int, e: int, k: int, gen, empty_expert: bool = True):
    """indices [T, k] (distinct experts per token, expert 0 unused when `empty_expert`) and dyadic weights [T, k]."""
    scores = torch.rand(t, e, generator=gen)
    if empty_expert:
        scores[:, 0] = -1.0
    indices = scores.topk(k, dim=-1).indices
    weights = torch.randint(1, 17, (t, k), generator=gen).to(torch.float64) / 8  # multiples of 1/8: exact products
    return weights, indices


def _apply(ys_by_assignment, weights):
    """sum_j weights[t, j] * y[t, j] (y [T, k, H])."""
    return (ys_by_assignment * weights.unsqueeze(-1)).sum(1)


def _per_assignment(x, indices, experts):
    """y[t, j] = expert indices[t, j] applied to x[t] (each pair computed on its own)."""
    t, k = indices.shape
    rows = [experts.forward(int(indices[a // k, a % k]), x[a // k:a // k + 1])[0] for a in range(t * k)]
    return torch.stack(rows).view(t, k, -1)


def variants(x, weights, indices, experts):
    """(message, output) of the classic mistakes, on an exact case."""
    t, k = indices.shape
    e_count = experts.num_experts
    y = _per_assignment(x, indices, experts)
    flat = indices.reshape(-1)
    order = torch.argsort(flat, stable=True)
    sorted_y = y.reshape(t * k, -1)[order]  # the experts' outputs in expert order
    token = order // k
    out = []
    out.append(("the un-permutation used `order` itself: sorted row p belongs to assignment order[p] -- scatter it "
                "back (y[order] = y_sorted) or gather with the inverse permutation",
                _apply(sorted_y[order].view(t, k, -1), weights)))
    wrong_token = order % k
    out.append(("assignment a = t * k + j belongs to token a // k, not a % k (the token index is order // k)",
                torch.zeros_like(x).index_add_(0, wrong_token, _per_assignment(
                    x[wrong_token], flat[order].view(-1, 1), experts).view(-1, x.shape[1])
                    * weights.reshape(-1)[order].unsqueeze(1))))
    out.append(("the gate weights were applied twice (to the tokens going in and to the outputs coming back)",
                _apply(y, weights * weights)))
    out.append(("the gate weights are missing: out[t] = sum_j weights[t, j] * expert_j(x[t])",
                _apply(y, torch.ones_like(weights))))
    out.append(("each sorted output row needs the weight of its own assignment: weights.reshape(-1)[order], not "
                "weights.reshape(-1) in the original order",
                torch.zeros_like(x).index_add_(0, token, sorted_y * weights.reshape(-1).unsqueeze(1))))
    out.append(("the gate weights were renormalised to sum 1: DeepSeek-V3's are already normalised and scaled by "
                "the route scale -- use them as given", _apply(y, weights / weights.sum(-1, keepdim=True))))
    out.append(("only the first of the k chosen experts was used: every token goes to all k of them",
                _apply(y[:, :1], weights[:, :1])))
    capacity = math.ceil(t * k / e_count)
    counts = torch.bincount(flat, minlength=e_count)
    rank = torch.arange(t * k) - (torch.cumsum(counts, 0) - counts)[flat[order]]  # position within the expert
    kept = (rank < capacity).to(x.dtype).unsqueeze(1)
    out.append((f"assignments past a fixed per-expert capacity ({capacity} = ceil(T*k/E)) were dropped: DeepSeek-V3 "
                f"drops none -- size each expert's slice by its count",
                torch.zeros_like(x).index_add_(0, token, sorted_y * kept * weights.reshape(-1)[order].unsqueeze(1))))
    last = torch.zeros_like(x)
    last[token] = sorted_y * weights.reshape(-1)[order].unsqueeze(1)  # out[token] = ...: the last write wins
    out.append(("out[token] = ... overwrites: a token with k assignments needs the sum of their weighted outputs "
                "(index_add_, or a sum over k after un-permuting)", last))
    first_rows = torch.cat([experts.forward(e, x[token][:n]) for e, n in enumerate(counts.tolist()) if n])
    out.append(("every expert ran on the first rows of the sorted tokens: expert e's slice starts where the previous "
                "one ended (offsets = cumsum(counts) - counts)",
                torch.zeros_like(x).index_add_(0, token, first_rows * weights.reshape(-1)[order].unsqueeze(1))))
    return out


def check(layer, cases, references=()) -> str:
    """layer(x [T, H], weights [T, k], indices [T, k], experts) -> [T, H]."""
    rng, gen = cases.rng, cases.gen
    exact_cases = [(37, 8, 2, 6, True), (rng.randint(5, 60), 16, 4, 4, True), (96, 6, 3, 5, False)]
    for t, e, k, h, empty in exact_cases:
        x = torch.randint(-8, 9, (t, h), generator=gen).to(torch.float64)
        weights, indices = _routing(t, e, k, gen, empty)
        experts = CountingExperts(LinearExperts(e, h, gen))
        what = f"your layer on T={t} tokens, E={e} experts, top-{k}, H={h} (exact arithmetic)"
        got = _call(layer, x, weights, indices, experts, what, references)
        ref = moe.moe_grouped(x, weights, indices, experts._experts)
        _expect_calls(experts, indices, what)
        if torch.equal(got, ref):
            continue
        for message, wrong in variants(x, weights, indices, experts._experts):
            if torch.equal(got, wrong):
                fail(f"{what}: {message}")
        bad = (got != ref).any(-1).nonzero()
        row = int(bad[0])
        fail(f"{what}: token {row} is {got[row].tolist()[:4]}..., the reference (moe.moe_grouped) gives "
             f"{ref[row].tolist()[:4]}... -- with integer tokens and weights in 1/8s every right layer gives exactly "
             f"these bits ({len(bad)} of {t} tokens differ)")
    # float32 SwiGLU experts, and the gradient
    t, e, k, h = rng.randint(40, 90), 8, 2, 16
    x = torch.randn(t, h, generator=gen)
    logits = torch.randn(t, e, generator=gen)
    weights, indices = moe.deepseek_v3_gate(logits, None, k, 1, 1, 2.5)
    experts = moe.make_experts(e, h, 24, seed=rng.randint(0, 10**6))
    what = f"your layer on T={t}, E={e}, top-{k}, SwiGLU experts in float32"
    x1, w1 = x.clone().requires_grad_(), weights.clone().requires_grad_()
    got = _call(layer, x1, w1, indices, CountingExperts(experts), what, references)
    x2, w2 = x.clone().requires_grad_(), weights.clone().requires_grad_()
    ref = moe.moe_grouped(x2, w2, indices, experts)
    expect_close(got.detach(), ref.detach(), f"{what}: output", rtol=1e-5, atol=1e-6)
    probe = torch.randn(t, h, generator=gen)
    if not got.requires_grad:
        fail(f"{what}: the output is cut off from autograd (no gradient reaches x or the gate weights): keep the "
             f"computation in torch tensor operations -- no .detach(), .item(), .tolist() or numpy on the data path")
    grads = torch.autograd.grad((got * probe).sum(), (x1, w1), allow_unused=True)
    ref_grads = torch.autograd.grad((ref * probe).sum(), (x2, w2))
    for name, g, r in zip(("the tokens x", "the gate weights"), grads, ref_grads):
        if g is None or not g.abs().sum() > 0:
            fail(f"{what}: no gradient reaches {name}: the layer must stay differentiable in them (the gate learns "
                 f"through its weights) -- no .detach(), .item() or .tolist() on them")
        expect_close(g, r, f"{what}: gradient with respect to {name}", rtol=1e-4, atol=1e-5)
    return (f"bit for bit equal to moe.moe_grouped on {len(exact_cases)} exact cases (an expert with no tokens "
            f"included), each expert called once on its own rows; float32 SwiGLU output and gradients (tokens, gate "
            f"weights) match autograd through the reference")


def _call(layer, x, weights, indices, experts, what, references):
    copies = (x.detach().clone(), weights.detach().clone(), indices.clone())
    got = learner_call(layer, (x, weights, indices, experts), what, references, library=True)
    for name, before, after in (("x", copies[0], x), ("weights", copies[1], weights), ("indices", copies[2], indices)):
        expect(torch.equal(before, after.detach()), f"{what}: your layer modified its input `{name}` in place; work "
                                                    f"on copies (the caller still needs it)")
    if not isinstance(got, torch.Tensor):
        fail(f"{what}: return the [T, H] output tensor; got {type(got).__name__}")
    expect(tuple(got.shape) == tuple(x.shape), f"{what}: the output must be [T, H] = {list(x.shape)}, got "
                                               f"{list(got.shape)}")
    return got


def _expect_calls(experts, indices, what):
    counts = torch.bincount(indices.reshape(-1), minlength=experts.num_experts).tolist()
    calls = experts.calls
    seen = [e for e, _ in calls]
    if len(calls) == indices.numel():
        fail(f"{what}: the experts were called {len(calls)} times, once per (token, expert) pair: sort the "
             f"assignments by expert and call each expert once on its contiguous slice (a grouped GEMM)")
    if any(seen.count(e) > 1 for e in set(seen)):
        e = next(e for e in seen if seen.count(e) > 1)
        fail(f"{what}: expert {e} was called {seen.count(e)} times: call each expert once, on all the rows routed "
             f"to it")
    rows = dict(calls)
    if sum(rows.values()) > indices.numel() and all(n == indices.shape[0] for n in rows.values()):
        fail(f"{what}: every expert ran on every token ({indices.shape[0]} rows each): E times the work -- give each "
             f"expert only the rows routed to it")
    for e, n in rows.items():
        if n and n != counts[e]:
            fail(f"{what}: expert {e} ran on {n} rows, but {counts[e]} assignments chose it: its slice is rows "
                 f"offsets[e] : offsets[e] + counts[e] of the sorted tokens")

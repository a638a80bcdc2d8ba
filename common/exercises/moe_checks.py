"""What lab 12's two MoE-layer exercises (12.5 sorted dispatch, 12.8 grouped GEMM) check alike: on random routings
(asymmetric sizes, unused experts, k = 1 and k > 1, float64), the output and every gradient against the naive loop,
inputs left unchanged, no call to the workbook's own layers, the gate weights applied -- and what the layer did,
watched op by op (`Watch`): matrix products, boolean-mask selections (`nonzero`), the full-size gradients that
indexing `w[e]` inside a loop leaves in the backward (`select_backward`), and the rows `act` saw."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from common.core.checks import expect, expect_close, fail
from common.exercises.cases import learner_call, refused
from common.moe import moe
from common.systems import capstone

CASES = [(29, 12, 8, 5, 2, (1,)), (16, 8, 20, 3, 1, ()), (41, 16, 12, 6, 3, (0, 4))]  # T, H, F, E, k, unused
# what the exercises hand the learner: lab 06's plan, gather and weighted scatter (the plan's own attributes too)
HANDED = ("common.moe.moe.dispatch_plan", "common.moe.moe.dispatch", "common.moe.moe.combine",
          "common.moe.moe.DispatchPlan")
MATMULS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "dot", "mv", "addmv", "_grouped_mm"}


def moe_case(tokens, hidden, ffn, experts, k, seed, unused=()):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    allowed = torch.tensor([e for e in range(experts) if e not in unused])
    indices = allowed[torch.rand(tokens, len(allowed), generator=g).topk(k, dim=1).indices]
    weights = torch.rand(tokens, k, generator=g, dtype=torch.float64) + 0.1
    ws = [torch.randn(experts, hidden, ffn, generator=g, dtype=torch.float64) / hidden ** 0.5,
          torch.randn(experts, hidden, ffn, generator=g, dtype=torch.float64) / hidden ** 0.5,
          torch.randn(experts, ffn, hidden, generator=g, dtype=torch.float64) / ffn ** 0.5]
    return x, weights, indices, ws


class Watch(TorchDispatchMode):
    """Counts the aten ops a layer runs, by name."""

    def __init__(self):
        super().__init__()
        self.ops: dict = {}
        self.flops = 0  # 2 x multiply-adds of the matrix products seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops[name] = self.ops.get(name, 0) + 1
        out = func(*args, **(kwargs or {}))
        if name in MATMULS and isinstance(out, torch.Tensor):
            first = args[1] if name.startswith("add") or name == "baddbmm" else args[0]  # addmm(bias, a, b)
            self.flops += 2 * out.numel() * first.shape[-1]  # out [.., m, n] x K, K the first operand's last dim
        return out

    def count(self, *names) -> int:
        return sum(self.ops.get(n, 0) for n in names)

    @property
    def matmuls(self) -> int:
        return sum(v for k, v in self.ops.items() if k in MATMULS)


@dataclass
class Seen:
    """What one case's layer did: where (for messages), experts, the forward's and the backward's ops, act's rows."""
    where: str
    experts: int
    forward: Watch
    backward: Watch
    act_rows: list = field(default_factory=list)
    rows: int = 0  # T x k


def _leaves(x, weights, ws):
    return [t.clone().requires_grad_() for t in (x, weights, *ws)]


def run_cases(fn, seed: int, call: str) -> list:
    """fn on each case, checked for what every MoE layer must do; returns a Seen per case."""
    seen = []
    for i, (t, h, f, e, k, unused) in enumerate(CASES):
        where = f"T={t}, H={h}, F={f}, E={e}, k={k}, unused experts {list(unused)} (seed {seed})"
        x, weights, indices, ws = moe_case(t, h, f, e, k, seed + i, unused)
        copies = [a.clone() for a in (x, weights, indices, *ws)]
        act_rows = []

        def act(gate, up):
            act_rows.append(tuple(gate.shape))
            return capstone.swiglu(gate, up)

        leaves = _leaves(x, weights, ws)
        given = (leaves[0], leaves[1], indices.clone(), leaves[2], leaves[3], leaves[4], act)
        fwd, used = Watch(), set()
        with fwd:
            out = learner_call(fn, given, f"{call} for {where}", tuple(capstone.LAYERS.values()), used,
                               allowed=HANDED, library=True)
        layers = {f"{f.__module__}.{f.__qualname__}" for f in capstone.LAYERS.values()}
        if used & layers:
            fail(f"{where}: you called common.systems.capstone's own MoE layer; this exercise is to write it")
        if used:
            raise refused(f"{call} for {where}", sorted(used)[0])
        expect(isinstance(out, torch.Tensor), f"{where}: expected a tensor [T, H], got {type(out).__name__}")
        for name, before, after in zip(("x", "weights", "indices", "w_gate", "w_up", "w_down"), copies, given):
            expect(torch.equal(before, after.detach()), f"{where}: your function modified its input {name}; work on "
                                                        f"copies")
        expected = capstone.moe_loop_forward(x, weights, indices, *ws)
        if out.shape == expected.shape and not torch.allclose(out.detach(), expected, rtol=1e-9, atol=1e-10):
            if torch.allclose(out.detach(), capstone.moe_loop_forward(x, torch.ones_like(weights), indices, *ws),
                              rtol=1e-9, atol=1e-10):
                fail(f"{where}: every expert's output was added with weight 1 -- multiply each expert's output "
                     f"by that token's gate weight (weights[t, j])")
            plan = moe.dispatch_plan(indices, e)
            if torch.allclose(out.detach(), _sorted_weights(x, weights.reshape(-1), plan, ws, t), rtol=1e-9,
                              atol=1e-10):
                fail(f"{where}: the gate weights were applied in the tokens' order to rows in the experts' order -- "
                     f"take each sorted row's weight through the same permutation (moe.combine does)")
            seen_rows = sum(rows(shape) for shape in act_rows)
            if 0 < seen_rows < t * k:
                fail(f"{where}: `act` saw {seen_rows} rows of the T*k = {t * k} routed ones: rows were dropped -- a "
                     f"capacity below the busiest expert's count ({int(plan.counts.max())}) loses its overflow rows")
        expect_close(out.detach(), expected, f"MoE output for {where}", rtol=1e-9, atol=1e-10)
        probe = torch.randn(expected.shape, generator=torch.Generator().manual_seed(seed + 100 + i),
                            dtype=torch.float64)
        bwd = Watch()
        try:
            with bwd:
                (out * probe).sum().backward()
        except RuntimeError as exc:
            fail(f"{where}: the backward pass failed ({exc}); build the output from differentiable ops (no "
                 f".detach(), no .data, no in-place writes into a tensor that needs grad)")
        ref_leaves = _leaves(x, weights, ws)
        ref = capstone.moe_loop_forward(ref_leaves[0], ref_leaves[1], indices, *ref_leaves[2:])
        (ref * probe).sum().backward()
        for name, got, want in zip(("x", "weights", "w_gate", "w_up", "w_down"), leaves, ref_leaves):
            expect(got.grad is not None, f"{where}: no gradient reached {name}; the layer must be differentiable "
                                         f"with respect to it")
            expect_close(got.grad, want.grad, f"gradient of {name} for {where}", rtol=1e-8, atol=1e-10)
        expect(len(act_rows) > 0, f"{where}: `act` was never called; apply the act you are given to the gate/up "
                                  f"projections")
        busiest = int(torch.bincount(indices.reshape(-1), minlength=e).max())
        routed, padded = 6 * h * f * t * k, 6 * h * f * e * busiest  # FLOPs: the T*k rows; padded to the busiest
        if fwd.flops > padded:
            every = fwd.flops >= 6 * h * f * e * t
            fail(f"{where}: the forward's matrix products did {fwd.flops:.3g} FLOPs, {fwd.flops / routed:.1f}x the "
                 f"{routed:.3g} of the T*k = {t * k} routed rows" +
                 (f": you ran every expert on every token (E x T = {e * t} rows) and weighted the results -- E/k "
                  f"times the work (32x for V3), what routing exists to avoid; run each expert on its own rows only"
                  if every else f"; pad each expert only to the busiest expert's count ({busiest} rows), not more"))
        seen.append(Seen(where, e, fwd, bwd, act_rows, t * k))
    return seen


def rows(shape) -> int:
    """Rows of a [..., features] shape."""
    n = 1
    for size in shape[:-1]:
        n *= size
    return n


def _sorted_weights(x, flat_weights, plan, ws, t):
    """The layer with the k x T gate weights taken in token order for rows in expert order (a likely mistake)."""
    rows = moe.dispatch(x, plan)
    out = torch.cat([capstone.ffn(r, ws[0][e], ws[1][e], ws[2][e])
                     for e, r in enumerate(rows.split(plan.counts.tolist()))])
    y = torch.zeros(t, x.shape[1], dtype=x.dtype)
    return y.index_add_(0, plan.token_index, out * flat_weights.unsqueeze(1))

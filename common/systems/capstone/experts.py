"""The block's experts: SwiGLU FFNs on stacked weights, run per expert (the naive loop) or grouped (one batch).

Weights are stacked: w_gate, w_up [E, H, F] and w_down [E, F, H] for the E routed experts (the shared expert has
its own [H, F] and [F, H] matrices). The layers take the gate's `weights` and `indices` [T, k].

- `moe_loop_forward` is the training branch of DeepSeek's Hugging Face modeling code (`DeepseekV2MoE.forward`,
  kept for V3 derivatives): repeat every token k times, then for each expert select its rows with a boolean mask,
  run the expert and write the rows back (`y[mask] = expert(x[mask])`), and sum the k results weighted. Every mask
  is a host sync (the row count; the mask is built twice per expert, as there), and in the backward every `x[mask]` and `y[mask] = ...` writes a gradient the
  size of ALL T x k rows: E full-size zero-fills and additions per step -- the hidden cost a profile finds.
- `moe_sorted_forward` is the inference branch of the same code (`DeepseekV2MoE.moe_infer`) made trainable: sort
  the T x k assignments by expert once (lab 06's `dispatch_plan`), read the per-expert counts on the host ONCE,
  run each expert on its contiguous slice of the sorted rows and combine. No masks, one host read; still 3 x E
  small GEMMs forward. Each expert's weights are taken with one `unbind` (indexing `w[e]` in the loop would give
  every use a full-size gradient of its own).
- `moe_grouped_forward` sorts the T x k assignments by expert (lab 06's `dispatch_plan`), lays each expert's rows
  into its own slot of a zero-padded [E, capacity, H] buffer (capacity = the busiest expert's count) and runs each
  weight as ONE batched GEMM (`torch.bmm`) over all experts, then gathers and combines. The padding is wasted work
  (`padding_waste`); a grouped-GEMM kernel (`torch._grouped_mm` on Hopper, DeepGEMM's m-grouped FP8 GEMM) skips it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from common.moe import moe


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, as Hugging Face's `ACT2FN["silu"]` writes it."""
    return F.silu(gate) * up


def ffn(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, act=swiglu):
    """One SwiGLU FFN on rows x [n, H] with [H, F], [H, F], [F, H] weights."""
    return act(x @ w_gate, x @ w_up) @ w_down


def moe_loop_forward(x, weights, indices, w_gate, w_up, w_down, act=swiglu):
    """DeepSeek's HF training branch: per expert, boolean-mask the repeated tokens, run, write back; [T, H]."""
    t, k = indices.shape
    xs = x.repeat_interleave(k, dim=0)
    flat = indices.reshape(-1)
    y = torch.empty_like(xs)
    # unbind once: separate matrices, as nn.ModuleList experts hold them (indexing w[e] in the loop would add a
    # full-size gradient per use on top of the masks' own)
    gates, ups, downs = w_gate.unbind(0), w_up.unbind(0), w_down.unbind(0)
    for e in range(len(gates)):  # as written there: the mask built twice, each use a host sync
        y[flat == e] = ffn(xs[flat == e], gates[e], ups[e], downs[e], act)
    return (y.view(t, k, -1) * weights.unsqueeze(-1).to(y.dtype)).sum(dim=1)


def moe_sorted_forward(x, weights, indices, w_gate, w_up, w_down, act=swiglu):
    """Sorted dispatch: each expert runs once on its contiguous slice of the sorted rows (one host read); [T, H]."""
    t, _ = indices.shape
    plan = moe.dispatch_plan(indices, w_gate.shape[0])
    rows = moe.dispatch(x, plan)
    gates, ups, downs = w_gate.unbind(0), w_up.unbind(0), w_down.unbind(0)
    outs = [ffn(r, gates[e], ups[e], downs[e], act) for e, r in enumerate(rows.split(plan.counts.tolist()))]
    return moe.combine(torch.cat(outs), plan, weights, t)


def padded_slots(plan: moe.DispatchPlan, experts: int) -> tuple[torch.Tensor, int]:
    """(slot [T*k], capacity): the row of each sorted assignment in an [experts * capacity] padded buffer, where
    capacity is the busiest expert's count (one host read: the buffer's shape)."""
    counts = plan.counts
    capacity = max(int(counts.max()), 1)
    expert_of_row = torch.repeat_interleave(torch.arange(experts, device=counts.device), counts)
    position = torch.arange(len(expert_of_row), device=counts.device) - plan.offsets.repeat_interleave(counts)
    return expert_of_row * capacity + position, capacity


def moe_grouped_forward(x, weights, indices, w_gate, w_up, w_down, act=swiglu):
    """The routed experts as three batched GEMMs over zero-padded expert slots; [T, H] (see the module doc)."""
    t, _ = indices.shape
    experts, hidden = w_gate.shape[0], x.shape[1]
    plan = moe.dispatch_plan(indices, experts)
    slot, capacity = padded_slots(plan, experts)
    rows = moe.dispatch(x, plan)
    buf = rows.new_zeros(experts * capacity, hidden).index_copy(0, slot, rows).view(experts, capacity, hidden)
    h = act(torch.bmm(buf, w_gate), torch.bmm(buf, w_up))
    out = torch.bmm(h, w_down).reshape(experts * capacity, hidden).index_select(0, slot)
    return moe.combine(out, plan, weights, t)


def padding_waste(indices: torch.Tensor, experts: int) -> float:
    """Fraction of the padded buffer's rows that are padding (0 when every expert gets the same count)."""
    counts = torch.bincount(indices.reshape(-1), minlength=experts)
    return 1.0 - float(counts.sum()) / (experts * max(int(counts.max()), 1))

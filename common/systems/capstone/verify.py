"""Verify before you time: a version's output and every gradient against the baseline's, within a per-tensor
tolerance (rtol x the tensor's largest magnitude: outputs are O(1), some gradients 1e-6)."""
from __future__ import annotations

import torch

from common.systems.capstone.block import Block, step
from common.systems.capstone.config import BASELINE, Version


def outputs_and_grads(block: Block, x: torch.Tensor, version: Version = BASELINE, layers=None) -> dict:
    """{"out": output, "grad.<param>": gradient, ...} of one step, detached copies: what equivalence compares."""
    out = step(block, x, version, layers)
    result = {"out": out.clone()}
    for name, t in block.params.items():
        result[f"grad.{name}"] = None if t.grad is None else t.grad.detach().clone()
    return result


def max_abs_error(ref: dict, got: dict, key: str = "out") -> float:
    return float((ref[key].double() - got[key].double()).abs().max())


def equivalent(ref: dict, got: dict, rtol: float = 1e-4) -> bool:
    """True when every tensor of `got` matches `ref` within rtol x the largest magnitude of that tensor in `ref`.
    Same keys and shapes, no NaN, no missing gradient."""
    if set(ref) != set(got):
        return False
    for key, r in ref.items():
        g = got[key]
        if r is None or g is None:
            if r is not g:
                return False
            continue
        if g.shape != r.shape or not torch.isfinite(g).all():
            return False
        scale = float(r.double().abs().max())
        err = float((g.double() - r.double()).abs().max())
        if not err <= rtol * scale + 1e-30:
            return False
    return True


def worst_relative_errors(ref: dict, got: dict) -> dict:
    """Per tensor: max |got - ref| / max |ref| (what `equivalent` compares with rtol)."""
    out = {}
    for key, r in ref.items():
        g = got.get(key)
        if r is None or g is None:
            out[key] = float("nan")
            continue
        out[key] = float((g.double() - r.double()).abs().max()) / max(float(r.double().abs().max()), 1e-30)
    return out


def verify(block: Block, x: torch.Tensor, version: Version, ref: dict, rtol: float = 1e-4, layers=None) -> float:
    """The worst relative error of `version` against the baseline's `ref`; raises AssertionError (naming the tensor)
    when it is not equivalent -- a wrong step is never timed."""
    got = outputs_and_grads(block, x, version, layers)
    errors = worst_relative_errors(ref, got)
    if not equivalent(ref, got, rtol):
        worst = max(errors, key=lambda k: errors[k] if errors[k] == errors[k] else float("inf"))
        raise AssertionError(f"{version.name} is not equivalent to the baseline: {worst} differs by "
                             f"{errors[worst]:.3g} of its scale (allowed {rtol:g}); not timing a wrong step")
    return max(errors.values())

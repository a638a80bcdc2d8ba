"""Lab 12's workload: a small DeepSeek-V3-shaped transformer block, naive first, then improved one change at a time.

The block (pre-norm, residual): RMSNorm -> attention with MLA-style low-rank KV (a shared latent c = h W_dkv of rank
`kv_rank`, from which K = c W_uk and V = c W_uv are recovered; no decoupled RoPE -- positions do not change the
profile) -> RMSNorm -> MoE FFN: the DeepSeek-V3 gate (`common.moe.moe.deepseek_v3_gate`) routes every token to `top_k`
of `experts` SwiGLU experts, plus one shared expert that every token uses (stored as expert number `experts`, the
last of the stacked weights; same intermediate size as a routed expert, as in DeepSeek-V3).

A `Version` says which implementation each part uses. The baseline is naive in the ways real code is: a per-token
Python loop for the MoE (with a host sync per routing decision), attention that materialises the N x N scores with a
hand-written softmax, an unfused elementwise SwiGLU chain, a host sync for logging inside the step, and a causal mask
and loss probe allocated on every step. `VERSIONS` fixes them one at a time, in the order lab 12's profile ranks them.
`step(block, x, version)` is one forward + backward; `outputs_and_grads` returns what the equivalence check compares.
Trace analysis (idle share, component shares) lives in `common.core.traces`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from common.core.validate import whole
from common.moe import moe


@dataclass(frozen=True)
class BlockConfig:
    batch: int = 1
    seq: int = 256
    hidden: int = 256
    heads: int = 4
    head_dim: int = 64
    kv_rank: int = 64  # MLA latent width
    experts: int = 16  # routed experts (the shared one comes on top)
    top_k: int = 4
    n_group: int = 4
    topk_group: int = 2
    expert_ffn: int = 128  # intermediate size of each expert, routed and shared
    route_scale: float = 2.5
    eps: float = 1e-6

    def __post_init__(self):
        for name in ("batch", "seq", "hidden", "heads", "head_dim", "kv_rank", "experts", "top_k", "n_group",
                     "topk_group", "expert_ffn"):
            whole(name, getattr(self, name))
        moe.check_routing(self.experts, self.top_k, self.n_group, self.topk_group)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


QUICK = BlockConfig()
FULL = BlockConfig(batch=2, seq=1024, hidden=1024, heads=8, head_dim=128, kv_rank=256, experts=32, top_k=4,
                   n_group=8, topk_group=4, expert_ffn=512)


def config_for(profile: str) -> BlockConfig:
    """The block's size for a profile: `quick` (a naive step: ~0.3 s on a quiet CPU core, 1-2 s on a busy one) or
    `full` (a GPU)."""
    if profile not in ("quick", "full"):
        raise ValueError(f"profile={profile!r} is not a resolved profile; allowed: 'quick', 'full'")
    return QUICK if profile == "quick" else FULL


@dataclass(frozen=True)
class Version:
    """Which implementation each part of the step uses."""

    name: str
    moe: str = "loop"  # "loop": per token, in Python; "grouped": sorted dispatch, one GEMM chain per expert
    attention: str = "naive"  # "naive": N x N scores, hand-written softmax; "sdpa": F.scaled_dot_product_attention
    compiled: bool = False  # the SwiGLU elementwise chain through torch.compile (one static shape: grouped MoE only)
    host_sync: bool = True  # log the loss and the expert load with .item()/.tolist() inside the step
    preallocated: bool = False  # causal mask and loss probe built once, not on every step

    def __post_init__(self):
        if self.moe not in ("loop", "grouped"):
            raise ValueError(f"moe={self.moe!r}; allowed: 'loop', 'grouped'")
        if self.attention not in ("naive", "sdpa"):
            raise ValueError(f"attention={self.attention!r}; allowed: 'naive', 'sdpa'")
        if self.compiled and self.moe != "grouped":
            raise ValueError("compiled=True needs moe='grouped' (the per-token loop would recompile per shape)")


BASELINE = Version("baseline")
_FIXES = [("grouped MoE", dict(moe="grouped")), ("SDPA", dict(attention="sdpa")),
          ("compiled SwiGLU", dict(compiled=True)), ("no host sync", dict(host_sync=False)),
          ("preallocated", dict(preallocated=True))]


def cumulative_versions(fixes=_FIXES) -> list[Version]:
    """The baseline, then each fix applied on top of the previous version."""
    out = [BASELINE]
    for name, change in fixes:
        out.append(replace(out[-1], name=f"+ {name}", **change))
    return out


VERSIONS = cumulative_versions()


# ---------------------------------------------------------------------------------------------- parameters
def make_params(cfg: BlockConfig, seed: int = 0, device: str = "cpu", dtype=torch.float32) -> dict:
    """The block's weights (leaf tensors with requires_grad), drawn from a fixed seed; scaled so activations stay O(1).

    Experts are stacked: w_gate, w_up [E+1, H, F], w_down [E+1, F, H]; index E is the shared expert."""
    g = torch.Generator().manual_seed(seed)
    d, a, e, f = cfg.hidden, cfg.heads * cfg.head_dim, cfg.experts, cfg.expert_ffn

    def w(*shape, fan_in, scale=1.0):
        t = torch.randn(*shape, generator=g, dtype=torch.float64) * (scale / math.sqrt(fan_in))
        return t.to(device=device, dtype=dtype).requires_grad_()

    params = {
        "norm1": (1 + 0.1 * torch.randn(d, generator=g, dtype=torch.float64)).to(device, dtype).requires_grad_(),
        "wq": w(d, a, fan_in=d), "w_dkv": w(d, cfg.kv_rank, fan_in=d), "w_uk": w(cfg.kv_rank, a, fan_in=cfg.kv_rank),
        "w_uv": w(cfg.kv_rank, a, fan_in=cfg.kv_rank), "wo": w(a, d, fan_in=a),
        "norm2": (1 + 0.1 * torch.randn(d, generator=g, dtype=torch.float64)).to(device, dtype).requires_grad_(),
        "w_router": w(d, e, fan_in=d, scale=2.0),
        "w_gate": w(e + 1, d, f, fan_in=d), "w_up": w(e + 1, d, f, fan_in=d), "w_down": w(e + 1, f, d, fan_in=f),
    }
    return params


def router_bias(cfg: BlockConfig, seed: int = 0, device: str = "cpu", dtype=torch.float32) -> torch.Tensor:
    """The gate's load-balancing bias (chooses experts, does not weight them; no gradient): small, fixed."""
    g = torch.Generator().manual_seed(seed + 1)
    return (0.05 * torch.randn(cfg.experts, generator=g, dtype=torch.float64)).to(device, dtype)


def make_input(cfg: BlockConfig, seed: int = 0, device: str = "cpu", dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 2)
    return torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g, dtype=torch.float64).to(device, dtype)


# ---------------------------------------------------------------------------------------------- the pieces
def rmsnorm(x, w, eps: float):
    """RMSNorm as it is usually first written: four elementwise passes and a reduction."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def swiglu_act(gate, up):
    """silu(gate) * up written out: five elementwise passes over the [rows, F] activations (and more backward)."""
    return gate * (1.0 / (1.0 + torch.exp(-gate))) * up


def causal_mask(n: int, device="cpu", dtype=torch.float32) -> torch.Tensor:
    """Additive causal mask [n, n]: 0 on and below the diagonal, -inf above."""
    return torch.full((n, n), float("-inf"), device=device, dtype=dtype).triu(1)


def naive_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(d) + mask) v with the N x N scores materialised and the softmax written by hand."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores + mask
    scores = scores - scores.amax(-1, keepdim=True)
    p = torch.exp(scores)
    p = p / p.sum(-1, keepdim=True)
    return p @ v


def sdpa_attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def expert_ffn(x, e: int, w_gate, w_up, w_down, act=swiglu_act):
    """Expert e (index E = the shared one) on rows x [n, H] -> [n, H]. Pass the weights unbound (tuples of [H, F]):
    indexing a stacked tensor, w[e], makes its backward write a zero gradient the size of ALL experts per use."""
    return act(x @ w_gate[e], x @ w_up[e]) @ w_down[e]


def moe_loop_forward(x, weights, indices, w_gate, w_up, w_down, act=swiglu_act):
    """The obvious MoE: for every token, the shared expert plus its top-k experts, one at a time. Reading each expert
    id with int() is a host sync per decision (free on a CPU, a pipeline drain each on a GPU)."""
    shared = w_gate.shape[0] - 1
    w_gate, w_up, w_down = w_gate.unbind(0), w_up.unbind(0), w_down.unbind(0)  # not w[e]: see expert_ffn
    rows = []
    for t in range(x.shape[0]):
        xt = x[t:t + 1]
        acc = expert_ffn(xt, shared, w_gate, w_up, w_down, act)
        for j in range(indices.shape[1]):
            e = int(indices[t, j])
            acc = acc + weights[t, j] * expert_ffn(xt, e, w_gate, w_up, w_down, act)
        rows.append(acc)
    return torch.cat(rows)


def moe_grouped_forward(x, weights, indices, w_gate, w_up, w_down, act=swiglu_act):
    """Lab 06's sorted dispatch with the shared expert as one more expert (weight 1, every token): the T*(k+1) rows
    are grouped by expert, each expert runs ONE matmul per weight on its contiguous slice, `act` runs once on all
    rows (one static shape, so a compiled `act` compiles once), and `combine` scatters the results back weighted."""
    t, k = indices.shape
    n_exp = w_gate.shape[0]
    idx = torch.cat([indices, torch.full((t, 1), n_exp - 1, dtype=indices.dtype, device=indices.device)], 1)
    wts = torch.cat([weights, torch.ones(t, 1, dtype=weights.dtype, device=weights.device)], 1)
    w_gate, w_up, w_down = w_gate.unbind(0), w_up.unbind(0), w_down.unbind(0)
    plan = moe.dispatch_plan(idx, n_exp)
    xs = moe.dispatch(x, plan).split(plan.counts.tolist())  # the one host sync the grouped layer needs
    gate = torch.cat([xe @ w_gate[e] for e, xe in enumerate(xs)])
    up = torch.cat([xe @ w_up[e] for e, xe in enumerate(xs)])
    h = act(gate, up).split(plan.counts.tolist())
    ys = torch.cat([he @ w_down[e] for e, he in enumerate(h)])
    return moe.combine(ys, plan, wts, t)


# ---------------------------------------------------------------------------------------------- the block
class Block:
    """Weights, router bias and the per-version state (compiled act, preallocated mask and probe) of one block."""

    def __init__(self, cfg: BlockConfig, seed: int = 0, device: str = "cpu", dtype=torch.float32):
        self.cfg, self.seed, self.device, self.dtype = cfg, seed, device, dtype
        self.params = make_params(cfg, seed, device, dtype)
        self.bias = router_bias(cfg, seed, device, dtype)
        self._compiled_act = None
        self._mask = None
        self._probe = None
        self.log: list = []  # what the host-syncing versions log

    # -- per-step constants: built every step unless the version preallocates them
    def mask(self, version: Version) -> torch.Tensor:
        if not version.preallocated:
            return causal_mask(self.cfg.seq, self.device, self.dtype)
        if self._mask is None:
            self._mask = causal_mask(self.cfg.seq, self.device, self.dtype)
        return self._mask

    def probe(self, version: Version) -> torch.Tensor:
        """The fixed random direction the loss projects the output on (loss = <out, probe>)."""
        def make():
            g = torch.Generator().manual_seed(self.seed + 3)
            shape = (self.cfg.batch, self.cfg.seq, self.cfg.hidden)
            return torch.randn(*shape, generator=g, dtype=torch.float64).to(self.device, self.dtype)
        if not version.preallocated:
            return make()
        if self._probe is None:
            self._probe = make()
        return self._probe

    def act(self, version: Version):
        if not version.compiled:
            return swiglu_act
        if self._compiled_act is None:
            self._compiled_act = torch.compile(swiglu_act)
        return self._compiled_act

    def forward(self, x: torch.Tensor, version: Version = BASELINE, moe_fn=None) -> torch.Tensor:
        """The block on x [B, N, H]. `moe_fn` overrides the version's MoE layer (same signature as
        `moe_grouped_forward`)."""
        cfg, p = self.cfg, self.params
        b, n, d = x.shape
        rf = torch.profiler.record_function
        with rf("norm"):
            h = rmsnorm(x, p["norm1"], cfg.eps)
        with rf("attention"):
            q = (h @ p["wq"]).view(b, n, cfg.heads, cfg.head_dim).transpose(1, 2)
            c = h @ p["w_dkv"]  # the latent an MLA KV cache would hold
            k = (c @ p["w_uk"]).view(b, n, cfg.heads, cfg.head_dim).transpose(1, 2)
            v = (c @ p["w_uv"]).view(b, n, cfg.heads, cfg.head_dim).transpose(1, 2)
            attend = naive_attention if version.attention == "naive" else sdpa_attention
            o = attend(q, k, v, self.mask(version)).transpose(1, 2).reshape(b, n, -1)
            x = x + o @ p["wo"]
        with rf("norm"):
            h = rmsnorm(x, p["norm2"], cfg.eps).reshape(b * n, d)
        with rf("gate"):
            weights, indices = moe.deepseek_v3_gate(h @ p["w_router"], self.bias, cfg.top_k, cfg.n_group,
                                                    cfg.topk_group, cfg.route_scale)
        if version.host_sync:
            self.log.append(torch.bincount(indices.flatten(), minlength=cfg.experts).tolist())
        with rf("moe"):
            layer = moe_fn or (moe_loop_forward if version.moe == "loop" else moe_grouped_forward)
            y = layer(h, weights, indices, p["w_gate"], p["w_up"], p["w_down"], self.act(version))
        return x + y.view(b, n, d)

    def zero_grad(self) -> None:
        for t in self.params.values():
            t.grad = None


def step(block: Block, x: torch.Tensor, version: Version = BASELINE, moe_fn=None) -> torch.Tensor:
    """One training step's compute: forward, loss = <out, probe>, backward (gradients land in block.params)."""
    block.zero_grad()
    out = block.forward(x, version, moe_fn)
    loss = (out * block.probe(version)).sum()
    if version.host_sync:
        loss_value = loss.item()  # logging the loss every step: a host sync
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"loss is {loss_value}")
        block.log.append(loss_value)
        del block.log[:-8]
    with torch.profiler.record_function("backward"):
        loss.backward()
    return out.detach()


def outputs_and_grads(block: Block, x: torch.Tensor, version: Version = BASELINE, moe_fn=None) -> dict:
    """{"out": output, "grad.<param>": gradient, ...} of one step, detached copies: what equivalence compares."""
    out = step(block, x, version, moe_fn)
    result = {"out": out.clone()}
    for name, t in block.params.items():
        result[f"grad.{name}"] = None if t.grad is None else t.grad.detach().clone()
    return result


def max_abs_error(ref: dict, got: dict, key: str = "out") -> float:
    return float((ref[key].double() - got[key].double()).abs().max())


def equivalent(ref: dict, got: dict, rtol: float = 1e-4) -> bool:
    """True when every tensor of `got` matches `ref` within rtol x the largest magnitude of that tensor in `ref`
    (a tolerance scaled per tensor: outputs and tiny gradients alike). Same keys, shapes, no NaN or missing grad."""
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


# ---------------------------------------------------------------------------------------------- the loop's tools
@dataclass
class Result:
    """One version of the step: verified against the baseline, then timed."""

    version: Version
    worst_rel_err: float  # largest max|got - ref| / max|ref| over the output and every gradient
    max_abs_err: float  # max |got - ref| of the output
    timing: object  # common.core.timing.Timing

    @property
    def ms(self) -> float:
        return self.timing.ms


def verify_and_time(block: Block, x: torch.Tensor, version: Version, ref: dict, rtol: float = 1e-4,
                    min_run_time: float = 1.0, moe_fn=None) -> Result:
    """Verify before you time: compare output and gradients with the baseline's `ref` (rtol x each tensor's largest
    magnitude); raise if they differ, else time the step with common.core.timing.bench (the first step, which compiles or
    allocates, is the warm-up)."""
    from common.core import timing
    got = outputs_and_grads(block, x, version, moe_fn)
    errors = worst_relative_errors(ref, got)
    if not equivalent(ref, got, rtol):
        worst = max(errors, key=lambda k: errors[k] if errors[k] == errors[k] else float("inf"))
        raise AssertionError(f"{version.name} is not equivalent to the baseline: {worst} differs by "
                             f"{errors[worst]:.3g} of its scale (allowed {rtol:g}); not timing a wrong step")
    t = timing.bench(step, block, x, version, moe_fn, label=version.name, min_run_time=min_run_time)
    return Result(version, max(errors.values()), max_abs_error(ref, got), t)


def profile_step(block: Block, x: torch.Tensor, version: Version, path, moe_fn=None, warmup: bool = True):
    """Profile one step (after a warm-up step unless `warmup=False`) with torch.profiler inside
    record_function("step"); write the Chrome trace to `path`. Returns the profiler (for its operator table)."""
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile, record_function
    if warmup:
        step(block, x, version, moe_fn)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if x.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        with record_function("step"):
            step(block, x, version, moe_fn)
            if x.device.type == "cuda":
                torch.cuda.synchronize()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return prof


def plot_waterfall(labels, ms, title: str = "Step time after each change"):
    """A waterfall: the baseline's bar, then each change as the step it took off (labelled with its ratio)."""
    from common.core import plots
    if len(labels) != len(ms) or not ms:
        raise ValueError(f"need one time per label, got {len(labels)} labels and {len(ms)} times")
    fig, ax = plots.figure(title, "", "step time (ms, log scale)", logy=True, figsize=(8.5, 4.2))
    for i, (label, t) in enumerate(zip(labels, ms)):
        top = ms[i - 1] if i else t
        ax.bar(i, max(top, t) - min(top, t) if i else t, bottom=min(top, t) if i else 0.0, width=0.6,
               color=plots.PALETTE[0] if i == 0 else (plots.PALETTE[2] if t <= top else plots.PALETTE[1]))
        ax.plot([i - 0.3, i + 0.3], [t, t], color="black", lw=1.5)
        ax.annotate(f"{t:.3g} ms" + (f"\n{top / t:.2g}x" if i else ""), (i, t), textcoords="offset points",
                    xytext=(0, -24 if i else 4), ha="center", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    ax.set_ylim(min(ms) / 3, max(ms) * 2)
    return fig


# ---------------------------------------------------------------------------------------------- work counts
def step_flops_and_bytes(block: Block, x: torch.Tensor, version: Version) -> tuple[float, float]:
    """FLOPs of one step (torch's FlopCounterMode: matmuls and attention, forward and backward) and the bytes its
    operators read and write if nothing stayed in cache (every aten op's tensor inputs and outputs): an upper bound on
    memory traffic, so the arithmetic intensity is a lower bound. Counted on the uncompiled equivalent of `version`
    (same math; a compiled graph hides its operators from the counters)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    class ByteCounter(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in torch.utils._pytree.tree_leaves((args, kwargs, out)):
                if isinstance(t, torch.Tensor):
                    ByteCounter.total += t.numel() * t.element_size()
            return out

    flops = FlopCounterMode(display=False)
    with flops, ByteCounter():
        step(block, x, replace(version, compiled=False))
    return float(flops.get_total_flops()), float(ByteCounter.total)


def main(argv=None) -> None:
    """`python -m common.systems.capstone --version final --steps 5`: run steps (for nsys / ncu on a GPU)."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--version", choices=["baseline", "final"], default="final")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--profile", choices=["quick", "full"], default="full")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    block = Block(config_for(args.profile), device=device)
    x = make_input(block.cfg, device=device)
    version = VERSIONS[0] if args.version == "baseline" else VERSIONS[-1]
    for i in range(args.steps):
        if device == "cuda":
            torch.cuda.nvtx.range_push(f"step {i}")
        step(block, x, version)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
    print(f"ran {args.steps} steps of {version.name} on {device}")


if __name__ == "__main__":
    main()

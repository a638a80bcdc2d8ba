"""Attention benchmarks: the four implementations across sequence lengths (`benchmark`, `ratio_table`) and the
Triton kernels' forward, backward and both against SDPA (`train_benchmark`, `train_ratio_table`). Every
implementation is verified against SDPA before it is timed."""
from __future__ import annotations

from common.kernels.attention.io_bytes import flash_io_bytes, naive_moved_bytes, tiled_eager_bytes
from common.kernels.attention.reference import attention_flops, naive_attention, tiled_attention
from common.kernels.attention.triton_backward import flash_attn_func, sdpa
from common.kernels.attention.triton_forward import CPU_BLOCKS, flash_attention

IMPLEMENTATIONS = ("naive", "tiled", "triton", "sdpa")


def implementation(name: str, causal: bool, tiled_blocks: tuple[int, int]):
    if name == "naive":
        return lambda q, k, v: naive_attention(q, k, v, causal)
    if name == "tiled":
        return lambda q, k, v: tiled_attention(q, k, v, *tiled_blocks, causal=causal)
    if name == "triton":
        return lambda q, k, v: flash_attention(q, k, v, causal)
    if name == "sdpa":
        return lambda q, k, v: sdpa(q, k, v, causal)
    raise ValueError(f"implementation {name!r} is unknown; allowed: {', '.join(IMPLEMENTATIONS)}")


def benchmark(seq_lens, batch: int = 1, heads: int = 2, head_dim: int = 64, dtype=None, causal: bool = False,
              impls=IMPLEMENTATIONS, device: str | None = None, min_run_time: float = 0.05,
              tiled_blocks: tuple[int, int] = (128, 128), max_naive_bytes: float = 8 * 2**30,
              max_tiled_seq: int | None = None, progress: bool = False) -> list[dict]:
    """Time each implementation at each sequence length (verified against SDPA first); one row per pair.

    Rows: impl, seq_len, ms, tflops (FLOPs = 4 B H N^2 D, halved when causal), hbm_bytes (what each implementation
    moves: `naive_moved_bytes` for "naive", `tiled_eager_bytes` for "tiled", `flash_io_bytes` for the fused
    kernels), intensity (FLOP/B) and rel_err vs SDPA. The naive version is skipped when its N x N matrices would exceed `max_naive_bytes`, the Python-looped tiled version above
    `max_tiled_seq` (default: no limit on a CPU, 4096 on a GPU).
    """
    import torch

    from common.core import timing
    from common.core.env import current
    dev = device or current().device
    dtype = dtype or (torch.bfloat16 if dev == "cuda" else torch.float32)
    max_tiled_seq = max_tiled_seq or (4096 if dev == "cuda" else 1 << 30)
    for name in impls:
        implementation(name, causal, tiled_blocks)  # validates the names
    elem = torch.empty((), dtype=dtype).element_size()
    rows = []
    seqs = list(seq_lens)
    it = seqs
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(seqs, desc="attention benchmark")
    for n in it:
        q, k, v = (torch.randn(batch, heads, n, head_dim, device=dev, dtype=dtype) for _ in range(3))
        ref = sdpa(q, k, v, causal).float()
        flops = attention_flops(batch, heads, n, head_dim, causal)
        for name in impls:
            if name == "naive" and batch * heads * n * n * (elem + 4) > max_naive_bytes:
                continue
            if name == "tiled" and n > max_tiled_seq:
                continue
            fn = implementation(name, causal, tiled_blocks)
            out = fn(q, k, v).float()
            err = ((out - ref).abs().max() / ref.abs().max()).item()
            t = timing.bench(fn, q, k, v, label=f"{name} N={n}", device=dev, min_run_time=min_run_time,
                             warmup=0 if dev == "cpu" else 1)  # the verification call above warmed it up
            if name == "naive":  # what the eager implementations really move, not the fused algorithms' counts
                moved = naive_moved_bytes(n, head_dim, elem, heads, batch, causal)
            elif name == "tiled":
                moved = tiled_eager_bytes(n, head_dim, *tiled_blocks, elem_bytes=elem, heads=heads, batch=batch)
            else:
                bm = 128 if dev == "cuda" else CPU_BLOCKS[0]
                moved = flash_io_bytes(n, head_dim, elem_bytes=elem, block_m=bm, heads=heads, batch=batch)
            rows.append({"impl": name, "seq_len": n, "ms": t.ms, "tflops": flops / t.median_s / 1e12,
                         "hbm_bytes": moved, "intensity": flops / moved, "rel_err": err, "iqr_%": 100 * t.spread})
        del q, k, v, ref
    return rows


def ratio_table(rows: list[dict], impl: str = "triton", baseline: str = "sdpa", unit: str = "TFLOP/s"):
    """A pandas table: FLOP rate per implementation (columns) and sequence length (rows), plus impl/baseline."""
    import pandas as pd
    scale = {"TFLOP/s": 1.0, "GFLOP/s": 1e3}.get(unit)
    if scale is None:
        raise ValueError(f"unit={unit!r}; allowed: 'TFLOP/s', 'GFLOP/s'")
    df = pd.DataFrame(rows).pivot(index="seq_len", columns="impl", values="tflops") * scale
    df = df[[c for c in IMPLEMENTATIONS if c in df.columns]]
    if impl in df.columns and baseline in df.columns:
        df[f"{impl}/{baseline}"] = df[impl] / df[baseline]
    return df


# ----------------------------------------------------------------------------------------------------------------------
# benchmark: forward, backward and both, Triton against SDPA

PASSES = ("fwd", "bwd", "fwd+bwd")
PASS_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}  # the backward's 5 matmuls against the forward's 2


def train_benchmark(seq_lens, head_dims=(64, 128), causal_modes=(False, True), tokens: int = 16384,
                    width: int = 2048, dtype=None, device: str | None = None, min_run_time: float = 0.2,
                    passes=PASSES) -> list[dict]:
    """Time the Triton kernels (`flash_attn_func`) and SDPA, forward, backward and both, through autograd.

    Shapes: batch = tokens // N (at least 1), heads = width // d (the FlashAttention papers' setting). FLOPs: the
    forward 4 B H N^2 d (halved when causal), the backward 2.5x that (FlashAttention-2's convention; the Triton
    backward really does 3.5x, since dQ's kernel recomputes S and dP). Rows: impl, pass, seq_len, head_dim, causal,
    ms, tflops; the gradients are checked against SDPA's first (max relative error in `rel_err`).
    """
    import torch

    from common.core import timing
    from common.core.env import current
    dev = device or current().device
    dtype = dtype or (torch.bfloat16 if dev == "cuda" else torch.float32)
    for name in passes:
        if name not in PASSES:
            raise ValueError(f"pass {name!r} is unknown; allowed: {', '.join(PASSES)}")
    impls = {"triton": lambda q, k, v, c: flash_attn_func(q, k, v, c),
             "sdpa": lambda q, k, v, c: sdpa(q, k, v, c)}
    rows = []
    for d in head_dims:
        heads = max(1, width // d)
        for n in seq_lens:
            batch = max(1, tokens // n)
            for causal in causal_modes:
                q, k, v = (torch.randn(batch, heads, n, d, device=dev, dtype=dtype, requires_grad=True)
                           for _ in range(3))
                do = torch.randn(batch, heads, n, d, device=dev, dtype=dtype)
                grads = {}
                for name, f in impls.items():
                    o = f(q, k, v, causal)
                    grads[name] = torch.autograd.grad(o, (q, k, v), do)
                err = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                          for a, b in zip(grads["triton"], grads["sdpa"]))
                fwd_flops = attention_flops(batch, heads, n, d, causal)
                for name, f in impls.items():
                    o = f(q, k, v, causal)
                    calls = {"fwd": lambda f=f: f(q, k, v, causal),
                             "bwd": lambda o=o: torch.autograd.grad(o, (q, k, v), do, retain_graph=True),
                             "fwd+bwd": lambda f=f: torch.autograd.grad(f(q, k, v, causal), (q, k, v), do)}
                    for p in passes:
                        t = timing.bench(calls[p], label=f"{name} {p} N={n} d={d}", device=dev,
                                         min_run_time=min_run_time, warmup=1)
                        rows.append({"impl": name, "pass": p, "seq_len": n, "head_dim": d, "causal": causal,
                                     "ms": t.ms, "tflops": PASS_FLOP_FACTOR[p] * fwd_flops / t.median_s / 1e12,
                                     "rel_err": err})
                    del o
                del q, k, v, do, grads
    return rows


def train_ratio_table(rows: list[dict], unit: str = "TFLOP/s"):
    """Per (head_dim, causal, seq_len): Triton and SDPA FLOP rates side by side and triton/sdpa, per pass."""
    import pandas as pd
    scale = {"TFLOP/s": 1.0, "GFLOP/s": 1e3}.get(unit)
    if scale is None:
        raise ValueError(f"unit={unit!r}; allowed: 'TFLOP/s', 'GFLOP/s'")
    df = pd.DataFrame(rows)
    wide = df.pivot_table(index=["head_dim", "causal", "seq_len"], columns=["pass", "impl"], values="tflops") * scale
    out = pd.DataFrame(index=wide.index)
    for p in [x for x in PASSES if x in df["pass"].unique()]:
        out[f"{p} triton"] = wide[(p, "triton")]
        out[f"{p} sdpa"] = wide[(p, "sdpa")]
        out[f"{p} ratio"] = wide[(p, "triton")] / wide[(p, "sdpa")]
    return out


# ----------------------------------------------------------------------------------------------------------------------
# what a CPU run needs to explain itself: SDPA's path, the roof in the same threads and dtype, the cache

def sdpa_backend(q, k, v, causal: bool = False) -> str:
    """The backend torch's SDPA picks for these inputs (`torch._fused_sdp_choice`): FLASH_ATTENTION on a CPU is
    ATen's fused flash-attention kernel for CPUs (blocks of queries and keys, S and P never stored whole), MATH the
    unfused composite of matmul, softmax and matmul; "unknown" where this torch does not say."""
    import torch
    try:
        from torch.nn.attention import SDPBackend
        return SDPBackend(int(torch._fused_sdp_choice(q, k, v, None, 0.0, causal))).name
    except (AttributeError, ImportError, RuntimeError, TypeError, ValueError):
        return "unknown"


def softmax_seconds_per_element(s, min_run_time: float = 0.02) -> float:
    """One timing (median of `timing.bench`) of the row softmax naive attention runs over its scores `s` (reads S,
    writes P), per element: comparable across sizes, so a step shows where S leaves a cache."""
    import torch

    from common.core import timing
    t = timing.bench(torch.softmax, s, -1, device=s.device.type, min_run_time=min_run_time, warmup=1)
    return t.median_s / s.numel()


def seconds_per_flop(fn, q, k, v, causal: bool = False, min_run_time: float = 0.02) -> float:
    """One timing of fn(q, k, v) (median of `timing.bench`), per FLOP of attention: comparable across lengths."""
    from common.core import timing
    b, h, n, d = q.shape
    t = timing.bench(fn, q, k, v, device=q.device.type, min_run_time=min_run_time, warmup=1)
    return t.median_s / attention_flops(b, h, n, d, causal)

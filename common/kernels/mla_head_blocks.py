"""What small head blocks cost. A decode kernel whose programs each take BLOCK_H of the step's query rows (heads x new
tokens) reads the KV cache once per block of rows: ceil(rows / BLOCK_H) passes per step (`mla_decode.kv_reads`),
for the same FLOPs. One pass does 2 x BLOCK_H x (Dk + Dv) FLOPs per Dk x bytes of cache it reads
(`mla_decode.kv_intensity`): while that is below the machine's ridge, a pass is memory-bound and the passes cost
time in proportion; above it, the FLOPs set the time and fewer passes gain nothing. V3 in BF16: 1.9 FLOP/B per row,
so on an H800 (ridge 295) every block of up to ~155 rows is memory-bound -- 16 rows read the cache 8 times where
FlashMLA's 64 read it twice, unless the re-reads hit in L2.

`head_blocked_attention(q, kv, head_dim_v, scale, block_h)`: MQA over one sequence's cache, one pass per block of rows
(PyTorch: a GEMM for the scores and one for the output per pass).
`head_block_cost(block_hs, ...)`: times the passes per block size on this machine, interleaved (on a CUDA GPU: the
Triton kernel itself over a paged batch), with the reads per step, the bytes with and without re-reads, the FLOPs
and the intensity of one pass -- the lab sets them beside its roofline.
"""
from __future__ import annotations

import torch

from common.core import measurement, timing
from common.core.validate import whole
from common.kernels import mla_decode


def head_blocked_attention(q, kv, head_dim_v: int, scale: float, block_h: int):
    """Non-causal MQA of rows q (R, Dk) over one cache kv (T, Dk), value kv[:, :head_dim_v]: one pass over the whole
    cache per block of `block_h` rows. Returns (R, head_dim_v)."""
    whole("block_h", block_h)
    if q.dim() != 2 or kv.dim() != 2 or q.shape[1] != kv.shape[1]:
        raise ValueError(f"q {tuple(q.shape)} must be (rows, Dk) and kv {tuple(kv.shape)} (T, Dk) with the same Dk")
    out = []
    for r0 in range(0, q.shape[0], block_h):
        p = torch.softmax(q[r0:r0 + block_h] @ kv.T * scale, dim=-1)     # reads the whole cache
        out.append(p @ kv[:, :head_dim_v])                                # and again, inside the same pass
    return torch.cat(out)


def _row(block_h, rows, seconds, spread, lens, s_q, heads, elem, engine) -> dict:
    reads = -(-rows // block_h)
    once = mla_decode.bytes_moved(lens, heads, s_q, 576, 512, elem)
    return {"block_h": block_h, "kv_reads": reads, "seconds": seconds, "spread": spread,
            "flops": mla_decode.flops(lens, heads, s_q, 576, 512), "bytes_kv_once": once,
            "bytes_with_rereads": mla_decode.bytes_moved(lens, heads, s_q, 576, 512, elem, reads),
            "intensity_per_pass": mla_decode.kv_intensity(min(block_h, rows), 576, 512, elem), "engine": engine}


def head_block_cost(block_hs=(1, 4, 16, 64), rows: int = 64, tokens: int = 8192, repeats: int = 5,
                    device: str | None = None, seed: int = 0) -> list:
    """One decode step's attention at each block size of `block_hs`, timed on `device` (default: CUDA when there is
    one): [{block_h, kv_reads, seconds (median), spread (IQR / median), flops, bytes_kv_once, bytes_with_rereads,
    intensity_per_pass, engine}], the same work at every size (V3's widths: Dk 576, Dv 512).

    CPU: `head_blocked_attention` in float32 over one cache of `tokens` tokens, the block sizes timed round-robin
    `repeats` times (`measurement.interleaved_samples`), so the machine's drifts hit them alike; the bytes count one
    read of the cache per pass, as the fused kernel reads it (a PyTorch pass reads it twice, scores then values, the
    second time often from the CPU's cache). CUDA: the Triton
    kernel (`mla_decode.mla_decode`, BF16) over 64 sequences of `tokens`, `rows` = 128 heads x 1 token by default
    sizes; block sizes under 16 (Triton's smallest dot) are left out."""
    whole("rows", rows), whole("tokens", tokens), whole("repeats", repeats, minimum=2)
    for bh in block_hs:
        whole("block_h", bh)
    cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    g = torch.Generator().manual_seed(seed)
    scale = 192 ** -0.5
    if not cuda:
        q = torch.randn(rows, 576, generator=g, dtype=torch.float64).float()
        kv = torch.randn(tokens, 576, generator=g, dtype=torch.float64).float()
        fns = {bh: (lambda bh=bh: head_blocked_attention(q, kv, 512, scale, bh)) for bh in block_hs}
        samples = measurement.interleaved_samples(fns, repeats)
        stats = {bh: measurement.median_and_iqr(ts) for bh, ts in samples.items()}
        return [_row(bh, rows, med, iqr / med, [tokens], 1, rows, 4, "PyTorch passes (CPU, float32)")
                for bh, (med, iqr) in stats.items()]
    heads, s_q = (rows, 1) if rows <= 128 else (128, -(-rows // 128))
    q, kvc, table, lens = mla_decode.random_paged_case([tokens] * 64, heads, s_q, dtype=torch.bfloat16,
                                                       device="cuda", seed=seed)
    out = []
    for bh in [b for b in block_hs if b >= 16]:
        plan = mla_decode.plan_splits(lens.cpu(), 64, mla_decode.kv_reads(heads, s_q, bh)).to("cuda")  # untimed
        t = timing.bench(lambda bh=bh, plan=plan: mla_decode.mla_decode(q, kvc, table, lens, 512, scale, block_h=bh,
                                                                        check=False, plan=plan), label=f"block_h {bh}")
        out.append(_row(bh, heads * s_q, t.median_s, t.spread, lens.tolist(), s_q, heads, 2,
                        "Triton kernel (GPU, BF16)"))
    return out

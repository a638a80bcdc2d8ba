"""FlashMLA-style MLA decoding in Triton: absorbed MLA in MQA mode over a paged KV cache, split over the KV length
and combined (flash-decoding), causal by per-sequence lengths.

Interface (FlashMLA's `flash_mla_with_kvcache`, simplified):
- q (B, S_q, H, Dk): S_q new tokens per sequence (1, or 2 with MTP speculative decoding), H query heads, Dk =
  kv_lora + rope = 576 for V3 ([W_uk-absorbed latent query ; RoPE query], `common.kernels.mla.mqa_inputs`);
- kv_cache (num_blocks, page, Dk): the paged cache, blocks of `page` tokens (64 in FlashMLA), each token's
  [latent ; RoPE key] -- one key shared by every head; the value is its first head_dim_v (512) values;
- block_table (B, max_blocks) int: physical block of each sequence's logical block; seq_lens (B,): cached tokens of
  each sequence, the new ones included. Query s of sequence b sits at position seq_lens[b] - S_q + s and attends
  keys 0..that position (causal).
Returns (out (B, S_q, H, head_dim_v), lse (B, S_q, H)) -- the natural-log log-sum-exp of the scaled scores.

The kernel, FlashMLA's way where Triton allows it:
- one program per (block of BLOCK_H query rows, work item). The rows are the H heads x S_q new tokens; BLOCK_H is 64
  where the rows allow (FlashMLA's 64-row blocks: V3's 128 heads are 2 row-blocks, 4 with MTP), so the cache is
  read ceil(rows / BLOCK_H) times per step (`kv_reads`), and the row-block is grid axis 0: the programs that read
  the same pages are launched next to each other, so a second read can find them still in L2 (FlashMLA's grid puts
  its m-blocks first too; whether it does is for the benchmark to show);
- a work item is a run of one sequence's pages (`plan_splits`): the pages of the whole batch are cut into runs of
  about equal length, so a long sequence gets more splits and a short one fewer (FlashMLA balances the same way,
  per SM part, and also lets one part run across sequences; here a run stays inside one sequence);
- each program walks its run through the block table, loads every tile of BLOCK_N tokens once -- its 512 latent
  values serve as key AND value for all BLOCK_H rows -- keeps an online softmax, and writes a partial output and its
  log-sum-exp; the combine kernel merges each sequence's splits (weights exp(lse_s - max)): flash-decoding.
`bytes_moved` counts the KV cache once, as FlashMLA's GB/s does; the traffic with the re-reads is
`bytes_moved(..., kv_reads=kv_reads(...))`. `paged_reference` is the float64 PyTorch reference; `paged_attention`
the vectorised PyTorch version the CPU serving loop uses. No GPU timing of this kernel is quoted here:
`benchmarks/mla_decode_bench.py` measures it (`make gpu-check`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from common.core.validate import whole

from common.kernels import mla

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2


def check_paged(q, kv_cache, block_table, seq_lens, head_dim_v: int) -> tuple:
    """Validate the decode inputs; return (B, S_q, H, Dk, page). Errors name the argument and what is allowed."""
    if q.dim() != 4:
        raise ValueError(f"q has shape {tuple(q.shape)}; expected (batch, s_q, heads, head_dim_k)")
    B, S_q, H, Dk = q.shape
    if kv_cache.dim() != 3 or kv_cache.shape[2] != Dk:
        raise ValueError(f"kv_cache has shape {tuple(kv_cache.shape)}; expected (num_blocks, page, {Dk}) to match "
                         f"q's head_dim_k")
    if not 0 < head_dim_v <= Dk:
        raise ValueError(f"head_dim_v={head_dim_v} is not allowed; allowed: 1..{Dk}")
    if block_table.dim() != 2 or block_table.shape[0] != B or block_table.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"block_table has shape {tuple(block_table.shape)} and dtype {block_table.dtype}; expected "
                         f"({B}, max_blocks) int32 or int64")
    if seq_lens.shape != (B,) or seq_lens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"seq_lens has shape {tuple(seq_lens.shape)} and dtype {seq_lens.dtype}; expected ({B},) "
                         f"int32 or int64")
    page = kv_cache.shape[1]
    lens = seq_lens.tolist()
    for b, n in enumerate(lens):
        if n < S_q:
            raise ValueError(f"seq_lens[{b}]={n} is shorter than s_q={S_q}: each new token must be in the cache")
        need = -(-n // page)
        if need > block_table.shape[1]:
            raise ValueError(f"seq_lens[{b}]={n} needs {need} blocks of {page}; block_table has "
                             f"{block_table.shape[1]} per sequence")
        used = block_table[b, :need]
        bad = (used < 0) | (used >= kv_cache.shape[0])
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise ValueError(f"block_table[{b}, {i}]={int(used[i])} is not a block of kv_cache (0.."
                             f"{kv_cache.shape[0] - 1})")
    return B, S_q, H, Dk, page


def random_paged_case(lens, heads: int = 16, s_q: int = 1, d_lat: int = 512, d_rope: int = 64, page: int = 64,
                      dtype=torch.float32, device="cpu", seed: int = 0) -> tuple:
    """Random decode inputs for sequences of lengths `lens`: (q, kv_cache, block_table, seq_lens), the blocks of all
    sequences shuffled through the pool (plus 3 unused blocks), never zeros."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-int(n) // page) for n in lens]
    blocks = sum(need) + 3
    kv = torch.randn(blocks, page, d_lat + d_rope, generator=g).to(device, dtype)
    perm = torch.randperm(blocks, generator=g).to(torch.int32)
    table = torch.zeros(len(need), max(need), dtype=torch.int32)
    i = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[i:i + n]
        i += n
    q = torch.randn(len(need), s_q, heads, d_lat + d_rope, generator=g).to(device, dtype)
    return q, kv, table.to(device), torch.tensor([int(n) for n in lens], dtype=torch.int32, device=device)


def random_lengths(batch: int, mean: int, s_q: int = 1, seed: int = 0) -> list:
    """Lengths uniform in [mean/2, 3 mean/2] (at least s_q), as a benchmark's mixed batch."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(max(s_q, mean // 2), mean * 3 // 2 + 1, (batch,), generator=g).tolist()


def gather_sequence(kv_cache, block_table, b: int, length: int):
    """The `length` cached tokens of sequence b, in order: (length, Dk)."""
    page = kv_cache.shape[1]
    blocks = block_table[b, :-(-length // page)].long()
    return kv_cache[blocks].reshape(-1, kv_cache.shape[2])[:length]


def paged_reference(q, kv_cache, block_table, seq_lens, head_dim_v: int = 512, scale: float | None = None,
                    causal: bool = True) -> tuple:
    """Float64 reference, one sequence at a time through `common.kernels.mla.mqa_attention`."""
    B, S_q, H, Dk, _ = check_paged(q, kv_cache, block_table, seq_lens, head_dim_v)
    scale = scale if scale is not None else 1.0 / math.sqrt(Dk)
    outs, lses = [], []
    for b, n in enumerate(seq_lens.tolist()):
        kv = gather_sequence(kv_cache, block_table, b, n).double()
        o, lse = mla.mqa_attention(q[b].double(), kv, head_dim_v, scale, causal)
        outs.append(o)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def paged_mla(q_nope, q_rope, kv_cache, block_table, seq_lens, w_uk, w_uv, scale: float | None = None):
    """Absorbed MLA over a paged latent cache in float64 -- the reference of a paged decode loop: W_uk folded into
    each query (`mla.absorb_query`), `paged_reference` over the cached [latent ; k_rope], W_uv on its output.
    q_nope (B, S, H, nope), q_rope (B, S, H, rope), w_uk (H, nope, kv_lora), w_uv (H, kv_lora, v_dim); scale
    defaults to 1 / sqrt(nope + rope). Returns (B, S, H, v_dim)."""
    B, S, H, nope = q_nope.shape
    if q_rope.shape[:3] != (B, S, H) or w_uk.dim() != 3 or w_uk.shape[:2] != (H, nope):
        raise ValueError(f"q_nope {tuple(q_nope.shape)}, q_rope {tuple(q_rope.shape)} and w_uk {tuple(w_uk.shape)} "
                         f"must be (B, S, H, nope), (B, S, H, rope) and (H, nope, kv_lora)")
    q_lat = mla.absorb_query(q_nope.double().reshape(B * S, H, nope), w_uk.double()).reshape(B, S, H, -1)
    scale = scale if scale is not None else 1.0 / math.sqrt(nope + q_rope.shape[3])
    o, _ = paged_reference(torch.cat([q_lat, q_rope.double()], -1), kv_cache.double(), block_table, seq_lens,
                           w_uk.shape[2], scale)
    return torch.einsum("bshc,hcv->bshv", o, w_uv.double())


def paged_attention(q, kv_cache, block_table, seq_lens, head_dim_v: int, scale: float, causal: bool = True):
    """The same in PyTorch, all sequences at once (gathered and padded to the longest), in q's dtype: out only."""
    B, S_q, H, Dk = q.shape
    page = kv_cache.shape[1]
    max_len = int(seq_lens.max())
    blocks = block_table[:, :-(-max_len // page)].long()
    kv = kv_cache[blocks].reshape(B, -1, Dk)                               # (B, T, Dk), padded
    scores = torch.einsum("bshd,btd->bsht", q, kv) * scale
    t = torch.arange(kv.shape[1], device=q.device)
    lens = seq_lens.to(q.device).long()[:, None, None, None]
    limit = lens - S_q + 1 + torch.arange(S_q, device=q.device)[None, :, None, None] if causal else lens
    scores = scores.masked_fill(t[None, None, None, :] >= limit, float("-inf"))
    return torch.einsum("bsht,btv->bshv", torch.softmax(scores, dim=-1), kv[..., :head_dim_v])


# ---------------------------------------------------------------- the split plan, the row blocks, the counts

@dataclass(frozen=True)
class SplitPlan:
    """The work items of one decode step: items (I, 4) int32 rows [sequence, first page, end page, split index],
    splits (B,) int32 (items per sequence), pages per item (the run length the plan aimed at)."""
    items: torch.Tensor
    splits: torch.Tensor
    pages_per_item: int

    @property
    def max_splits(self) -> int:
        return int(self.splits.max())

    def to(self, device) -> "SplitPlan":
        return SplitPlan(self.items.to(device), self.splits.to(device), self.pages_per_item)


def plan_splits(seq_lens, page: int, row_blocks: int = 1, programs: int = 264, num_splits: int | None = None):
    """Cut every sequence's pages into runs for the split kernel. Balanced (default): the batch's pages over about
    programs / row_blocks runs of equal length, so each program does about the same work whatever the lengths (264:
    2 per SM of an H100). `num_splits=n`: runs of ceil(longest / n) pages -- uniform splits sized by the longest
    sequence, as before (a short sequence gets fewer runs, none empty). A sequence's runs differ by at most a page.
    Computed on the host once per step; every layer of that step can reuse it (`mla_decode(..., plan=)`)."""
    lens = [int(n) for n in (seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else seq_lens)]
    whole("page", page), whole("row_blocks", row_blocks), whole("programs", programs)
    if not lens or min(lens) < 1:
        raise ValueError(f"seq_lens={lens[:8]} is not allowed; allowed: at least one sequence, each >= 1 token")
    pages = [-(-n // page) for n in lens]
    if num_splits is not None:
        chunk = -(-max(pages) // whole("num_splits", num_splits))
    else:
        chunk = max(1, -(-sum(pages) // max(1, -(-programs // row_blocks))))
    items, splits = [], []
    for b, n in enumerate(pages):
        k = -(-n // chunk)
        edges = [n * i // k for i in range(k + 1)]
        items += [[b, edges[i], edges[i + 1], i] for i in range(k)]
        splits.append(k)
    return SplitPlan(torch.tensor(items, dtype=torch.int32), torch.tensor(splits, dtype=torch.int32), chunk)


def default_block_h(rows: int) -> int:
    """64 query rows per program where the step has that many (FlashMLA's block), else the rows rounded up to a
    power of two (at least 16, Triton's smallest dot)."""
    whole("rows", rows)
    return 64 if rows >= 64 else max(16, 1 << (rows - 1).bit_length())


def kv_reads(heads: int, s_q: int = 1, block_h: int | None = None) -> int:
    """Times one decode step reads the KV cache: one read per block of query rows, ceil(heads x s_q / block_h)
    (DeepSeek-V3, 128 heads: 2 at 64 rows, 4 with MTP's 2 tokens; 8 and 16 at 16 rows)."""
    rows = whole("heads", heads) * whole("s_q", s_q)
    return -(-rows // whole("block_h", block_h or default_block_h(rows)))


def bytes_moved(seq_lens, heads: int, s_q: int, head_dim_k: int, head_dim_v: int, elem_bytes: int,
                kv_reads: int = 1) -> int:
    """HBM bytes of one decode call: every cached token's head_dim_k values `kv_reads` times (default once: the
    bytes FlashMLA's GB/s counts, whatever the kernel re-reads), the queries and the outputs."""
    lens = [int(n) for n in seq_lens]
    kv = sum(lens) * head_dim_k * elem_bytes * whole("kv_reads", kv_reads)
    return kv + len(lens) * s_q * heads * (head_dim_k + head_dim_v) * elem_bytes


def flops(seq_lens, heads: int, s_q: int, head_dim_k: int, head_dim_v: int) -> int:
    """2 x rows x keys x (Dk + Dv) per sequence (causal masking of the last s_q - 1 keys ignored, as FlashMLA does)."""
    return sum(2 * s_q * heads * int(n) * (head_dim_k + head_dim_v) for n in seq_lens)


def kv_intensity(rows: int, head_dim_k: int = 576, head_dim_v: int = 512, elem_bytes: int = 2) -> float:
    """FLOPs per byte of KV read by one pass of `rows` query rows: 2 x rows x (Dk + Dv) / (Dk x bytes) (V3, BF16:
    1.89 per row, 242 for 128 heads, 484 with MTP)."""
    return 2 * whole("rows", rows) * (head_dim_k + head_dim_v) / (head_dim_k * elem_bytes)


# ---------------------------------------------------------------- the Triton kernels

_kernels: dict = {}


def _build_kernels() -> dict:
    """Define the Triton kernels on first use (triton is imported then, after `setup` chose its mode)."""
    if _kernels:
        return _kernels
    import triton
    import triton.language as tl

    @triton.jit
    def mla_split_kernel(Q, KV, BT, SEQ, ITEMS, OP, LP, qk_scale, stride_qb, stride_qr, stride_kb, stride_kt,
                         stride_btb, stride_opb, stride_opr, stride_ops, stride_lpb, stride_lpr, R, H, S_Q,
                         D_LAT: tl.constexpr, D_ROPE: tl.constexpr, PAGE: tl.constexpr, BLOCK_H: tl.constexpr,
                         BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
        item = ITEMS + tl.program_id(1) * 4          # [sequence, first page, end page, split]
        b = tl.load(item).to(tl.int64)
        sp = tl.load(item + 3)
        seq_len = tl.load(SEQ + b)
        rows = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)   # axis 0: the row blocks of one run side by side
        row_ok = rows < R
        d_lat = tl.arange(0, D_LAT)
        d_rope = tl.arange(0, D_ROPE)
        q_ptr = Q + b * stride_qb + rows[:, None] * stride_qr
        q_lat = tl.load(q_ptr + d_lat[None, :], mask=row_ok[:, None], other=0.0)
        q_rope = tl.load(q_ptr + D_LAT + d_rope[None, :], mask=row_ok[:, None], other=0.0)
        if CAUSAL:  # row r is query s = r // H, at position seq_len - S_Q + s
            limit = seq_len - S_Q + rows // H + 1
        else:
            limit = seq_len + rows * 0
        start = tl.load(item + 1) * PAGE
        end = tl.minimum(tl.load(item + 2) * PAGE, seq_len)
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, D_LAT], dtype=tl.float32)
        for t0 in range(start, end, BLOCK_N):
            cols = t0 + tl.arange(0, BLOCK_N)
            col_ok = cols < end
            block = tl.load(BT + b * stride_btb + t0 // PAGE).to(tl.int64)
            kv_ptr = KV + block * stride_kb + ((t0 % PAGE) + tl.arange(0, BLOCK_N))[:, None] * stride_kt
            k_lat = tl.load(kv_ptr + d_lat[None, :], mask=col_ok[:, None], other=0.0)   # key and value
            k_rope = tl.load(kv_ptr + D_LAT + d_rope[None, :], mask=col_ok[:, None], other=0.0)
            s = tl.dot(q_lat, tl.trans(k_lat), input_precision=PRECISION)
            s += tl.dot(q_rope, tl.trans(k_rope), input_precision=PRECISION)
            keep = col_ok[None, :] & (cols[None, :] < limit[:, None])
            s = tl.where(keep, s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row with no key yet: no NaN from -inf - -inf
            p = tl.math.exp2(s - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(k_lat.dtype), k_lat, input_precision=PRECISION)
            m_i = m_new
        has = l_i > 0
        l_safe = tl.where(has, l_i, 1.0)
        lse = tl.where(has, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        op = OP + b * stride_opb + rows[:, None] * stride_opr + sp * stride_ops + d_lat[None, :]
        tl.store(op, acc / l_safe[:, None], mask=row_ok[:, None])
        tl.store(LP + b * stride_lpb + rows * stride_lpr + sp, lse, mask=row_ok)

    @triton.jit
    def mla_combine_kernel(OP, LP, SPLITS, O, L, stride_opb, stride_opr, stride_ops, stride_lpb, stride_lpr,
                           stride_ob, stride_or, stride_lb, R, D_V: tl.constexpr, BLOCK_R: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        b = tl.program_id(1).to(tl.int64)
        n = tl.load(SPLITS + b)                              # this sequence's splits (only those were written)
        ok = rows < R
        d = tl.arange(0, D_V)
        lp = LP + b * stride_lpb + rows * stride_lpr
        op = OP + b * stride_opb + rows[:, None] * stride_opr + d[None, :]
        m = tl.load(lp, mask=ok, other=0.0)
        for s in range(1, n):
            m = tl.maximum(m, tl.load(lp + s, mask=ok, other=0.0))
        m_safe = tl.where(m == float("-inf"), 0.0, m)       # a row no split saw (cannot happen causally): 0 / 0
        total = tl.exp(tl.load(lp, mask=ok, other=0.0) - m_safe)
        acc = total[:, None] * tl.load(op, mask=ok[:, None], other=0.0)
        for s in range(1, n):
            w = tl.exp(tl.load(lp + s, mask=ok, other=0.0) - m_safe)   # an empty run has lse -inf: weight 0
            total += w
            acc += w[:, None] * tl.load(op + s * stride_ops, mask=ok[:, None], other=0.0)
        tl.store(O + b * stride_ob + rows[:, None] * stride_or + d[None, :], (acc / total[:, None]).to(
            O.dtype.element_ty), mask=ok[:, None])
        tl.store(L + b * stride_lb + rows, m_safe + tl.log(total), mask=ok)

    _kernels.update(split=mla_split_kernel, combine=mla_combine_kernel)
    return _kernels


# A GPU launch per row block: (block_n, num_warps), chosen by compiling for sm_90 (`compile_for_gpu`, no GPU
# needed; Triton 3.9): the fewest register spills, then the largest tile. 16 and 32 rows compile without spills; 64
# rows spill at every launch tried (416 spill stores at the fewest: a 64 x 512 FP32 accumulator and the 64 x 576
# query held in registers, where FlashMLA splits the accumulator over two warpgroups). Not timed here: whether 64
# rows' fewer reads outweigh the spills is what the benchmark's block_h sweep measures on a GPU.
GPU_LAUNCH = {16: (32, 8), 32: (32, 8), 64: (16, 8)}
COMBINE_ROWS = 16   # rows per combine program, whatever BLOCK_H: 16 x 512 FP32 fits its registers (64 rows spill)


def default_launch(block_h: int, page: int, cuda: bool) -> tuple:
    """(block_n, num_warps): on a GPU, GPU_LAUNCH's (block_n at most the page); under the interpreter, tiles of 32
    tokens (at most the page; on the workbook's 2-core CPU VM the interpreter ran them faster than 16 or 64) and 4
    warps (which it ignores)."""
    if not cuda:
        return min(32, page), 4
    block_n, warps = GPU_LAUNCH.get(block_h, (32, 4))
    return min(block_n, page), warps


def compile_for_gpu(arch: int = 90, block_h: int = 16, block_n: int | None = None, num_warps: int | None = None,
                    num_stages: int = 2, head_dim_v: int = 512, rope: int = 64, page: int = 64, dtype: str = "bf16",
                    kernel: str = "split"):
    """Compile the split kernel (or, kernel="combine", the combine kernel at COMBINE_ROWS rows and 4 warps) ahead of
    time for compute capability `arch` with no GPU present (Triton's NVIDIA backend; TRITON_INTERPRET unset in this
    process); block_n and num_warps default to `default_launch`'s GPU choice. Returns Triton's compiled kernel:
    `.metadata.shared` bytes, and `common.kernels.attention.registers_and_spills` gives registers and spills."""
    import os
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compile_for_gpu needs TRITON_INTERPRET unset: run it in a process without the interpreter")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    launch = default_launch(block_h, page, cuda=True)
    ptr = f"*{dtype}"
    if kernel == "combine":
        signature = {"OP": "*fp32", "LP": "*fp32", "SPLITS": "*i32", "O": ptr, "L": "*fp32"}
        signature.update({n: "i32" for n in ("stride_opb", "stride_opr", "stride_ops", "stride_lpb", "stride_lpr",
                                             "stride_ob", "stride_or", "stride_lb", "R")})
        signature.update({"D_V": "constexpr", "BLOCK_R": "constexpr"})
        src = ASTSource(fn=_build_kernels()["combine"], signature=signature,
                        constexprs={"D_V": head_dim_v, "BLOCK_R": COMBINE_ROWS},
                        attrs={(i,): [["tt.divisibility", 16]] for i in range(5)})
        return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4, "num_stages": 2})
    signature = {"Q": ptr, "KV": ptr, "BT": "*i32", "SEQ": "*i32", "ITEMS": "*i32", "OP": "*fp32", "LP": "*fp32",
                 "qk_scale": "fp32"}
    signature.update({n: "i32" for n in ("stride_qb", "stride_qr", "stride_kb", "stride_kt", "stride_btb", "stride_opb",
                                         "stride_opr", "stride_ops", "stride_lpb", "stride_lpr", "R", "H", "S_Q")})
    constexprs = {"D_LAT": head_dim_v, "D_ROPE": rope, "PAGE": page, "BLOCK_H": block_h,
                  "BLOCK_N": block_n or launch[0], "CAUSAL": True, "PRECISION": "ieee" if dtype == "fp32" else "tf32"}
    signature.update({n: "constexpr" for n in constexprs})
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(7)}     # torch allocations are 16-byte aligned
    src = ASTSource(fn=_build_kernels()["split"], signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps or launch[1], "num_stages": num_stages})


def _pow2(name: str, v: int) -> None:
    if v < 16 or v & (v - 1):
        raise ValueError(f"{name}={v} is not allowed; allowed: a power of two >= 16 (a Triton tile)")


def mla_decode(q, kv_cache, block_table, seq_lens, head_dim_v: int = 512, scale: float | None = None,
               num_splits: int | None = None, block_h: int | None = None, block_n: int | None = None,
               causal: bool = True, check: bool = True, num_warps: int | None = None, num_stages: int = 2,
               plan: SplitPlan | None = None) -> tuple:
    """Paged MLA decoding with split-KV and combine (see the module docstring). Returns (out, lse).

    Dk - head_dim_v (the RoPE part) and head_dim_v must be powers of two of at least 16 (Triton's tiles).
    block_h: query rows per program (default `default_block_h`: 64 where the step has 64 rows); block_n: tokens per
    tile, dividing the page (default `default_launch`); num_splits: uniform runs sized by the longest sequence
    instead of the balanced plan; plan: a `plan_splits` result to reuse (one per step for every layer).
    `check=False` skips the host-side validation (one device sync)."""
    if check:
        B, S_q, H, Dk, page = check_paged(q, kv_cache, block_table, seq_lens, head_dim_v)
    else:
        (B, S_q, H, Dk), page = q.shape, kv_cache.shape[1]
    R = S_q * H
    block_h = block_h or default_block_h(R)
    for name, v in (("head_dim_v", head_dim_v), ("head_dim_k - head_dim_v", Dk - head_dim_v), ("block_h", block_h)):
        _pow2(name, v)
    launch = default_launch(block_h, page, q.is_cuda)
    block_n = block_n or launch[0]
    if block_n < 16 or block_n & (block_n - 1) or page % block_n:
        raise ValueError(f"block_n={block_n} is not allowed; allowed: a power of two >= 16 that divides the page "
                         f"({page})")
    if q.dtype != kv_cache.dtype:
        raise ValueError(f"q is {q.dtype} and kv_cache {kv_cache.dtype}; they must match")
    if not q.is_contiguous() or kv_cache.stride(2) != 1:
        raise ValueError("q must be contiguous and kv_cache contiguous in its last dimension")
    scale = scale if scale is not None else 1.0 / math.sqrt(Dk)
    row_blocks = -(-R // block_h)
    if plan is None:
        plan = plan_splits(seq_lens.cpu(), page, row_blocks, 264 if q.is_cuda else 4, num_splits)
    elif plan.splits.shape != (B,):
        raise ValueError(f"plan has {plan.splits.shape[0]} sequences; the batch has {B}")
    plan = plan.to(q.device)
    q2 = q.reshape(B, R, Dk)
    seq = seq_lens.to(device=q.device, dtype=torch.int32)
    bt = block_table.to(device=q.device, dtype=torch.int32)
    o_part = torch.empty(B, R, plan.max_splits, head_dim_v, device=q.device, dtype=torch.float32)
    l_part = torch.empty(B, R, plan.max_splits, device=q.device, dtype=torch.float32)
    k = _build_kernels()
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    k["split"][(row_blocks, plan.items.shape[0])](
        q2, kv_cache, bt, seq, plan.items, o_part, l_part, scale * LOG2E, q2.stride(0), q2.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), bt.stride(0), o_part.stride(0), o_part.stride(1), o_part.stride(2),
        l_part.stride(0), l_part.stride(1), R, H, S_q, D_LAT=head_dim_v, D_ROPE=Dk - head_dim_v, PAGE=page,
        BLOCK_H=block_h, BLOCK_N=block_n, CAUSAL=causal, PRECISION=precision, num_warps=num_warps or launch[1],
        num_stages=num_stages)
    out = torch.empty(B, R, head_dim_v, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, R, device=q.device, dtype=torch.float32)
    k["combine"][(-(-R // COMBINE_ROWS), B)](o_part, l_part, plan.splits, out, lse, o_part.stride(0),
                                             o_part.stride(1), o_part.stride(2), l_part.stride(0), l_part.stride(1),
                                             out.stride(0), out.stride(1), lse.stride(0), R, D_V=head_dim_v,
                                             BLOCK_R=COMBINE_ROWS)
    return out.reshape(B, S_q, H, head_dim_v), lse.reshape(B, S_q, H)

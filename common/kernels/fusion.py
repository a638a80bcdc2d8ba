"""Kernel fusion: first Triton kernels, their PyTorch references, and the bytes each one moves.

Kernels (same source compiled on a GPU, interpreted on a CPU): `vector_add`, `softmax` (over rows, fused: one read and
one write of the matrix) and `chain_fused` (the elementwise chain of `chain_eager` in one pass). Byte models:
`vector_add_bytes`, `softmax_bytes`, `naive_softmax_bytes`, `chain_bytes`. `fraction_of_copy_bw` expresses a kernel's
speed against this device's measured copy bandwidth (`common.core.ceilings`). `compile_and_capture` runs `torch.compile`
once and returns the code Inductor generated.

Triton is imported lazily, after `common.core.env` has set TRITON_INTERPRET on a machine without a GPU: importing this
module never imports triton.
"""
from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass

from common.core.validate import whole

# The elementwise chain of the lab: y = sigmoid(2x + 1) * 3, four elementwise ops in eager PyTorch.
CHAIN_OPS = 4
# FLOPs per element, counting each arithmetic op once: mul, add, sigmoid = 1/(1+exp(-t)) as 4 (neg, exp, add, div),
# mul. A convention stated once; what matters is that it is far below any machine's ridge point.
CHAIN_FLOPS_PER_ELEMENT = 7
MAX_SOFTMAX_COLS = 32768  # one row per program, held in registers: beyond this a row no longer fits


# ---------------------------------------------------------------------------------------------- byte models
def vector_add_bytes(n_elements: int, bytes_per_element: int) -> int:
    """Bytes `out = x + y` moves: it reads x and y and writes out, each n_elements long."""
    whole("n_elements", n_elements, 0)
    whole("bytes_per_element", bytes_per_element, 1)
    return 3 * n_elements * bytes_per_element


def softmax_bytes(rows: int, cols: int, bytes_per_element: int) -> int:
    """Bytes a fused row softmax moves: the matrix read once and the result written once."""
    whole("rows", rows, 0)
    whole("cols", cols, 0)
    whole("bytes_per_element", bytes_per_element, 1)
    return 2 * rows * cols * bytes_per_element


def naive_softmax_bytes(rows: int, cols: int, bytes_per_element: int) -> int:
    """Bytes `softmax_naive` moves, op by op (M rows, N columns): max reads MN and writes M; subtract reads MN + M
    and writes MN; exp reads MN, writes MN; sum reads MN, writes M; divide reads MN + M, writes MN.
    In all 5MN + 2M elements read and 3MN + 2M written."""
    softmax_bytes(rows, cols, bytes_per_element)  # validates
    m, n = rows, cols
    return (8 * m * n + 4 * m) * bytes_per_element


def chain_bytes(n_elements: int, n_ops: int, bytes_per_element: int, fused: bool) -> int:
    """Bytes a chain of `n_ops` unary elementwise ops on n_elements moves.

    Unfused (eager), every op reads its input from memory and writes its output back: 2 * n * b per op.
    Fused, the input is read once and the output written once; the intermediates stay in registers: 2 * n * b.
    """
    whole("n_elements", n_elements, 0)
    whole("n_ops", n_ops, 1)
    whole("bytes_per_element", bytes_per_element, 1)
    if not isinstance(fused, bool):
        raise ValueError(f"fused={fused!r} must be True or False")
    passes = 1 if fused else n_ops
    return 2 * n_elements * bytes_per_element * passes


def fraction_of_copy_bw(nbytes: float, seconds: float, copy_gbps: float) -> float:
    """Achieved bandwidth (nbytes / seconds) as a fraction of the measured copy bandwidth in GB/s."""
    if not nbytes >= 0:
        raise ValueError(f"nbytes={nbytes!r} must be >= 0")
    if not seconds > 0:
        raise ValueError(f"seconds={seconds!r} must be > 0")
    if not copy_gbps > 0:
        raise ValueError(f"copy_gbps={copy_gbps!r} must be > 0 GB/s")
    return nbytes / seconds / (copy_gbps * 1e9)


def eager_traffic(fn, *args) -> tuple[int, int]:
    """(kernels, bytes) of `fn(*args)` run eagerly: every aten op it dispatches, and the bytes of each op's tensor
    inputs and outputs -- what one kernel per op reads and writes when nothing stays in cache."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    count = [0, 0]

    class Traffic(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            count[0] += 1
            count[1] += sum(t.numel() * t.element_size() for t in torch.utils._pytree.tree_leaves((args, kwargs, out))
                            if isinstance(t, torch.Tensor))
            return out

    with Traffic():
        fn(*args)
    return count[0], count[1]


# ---------------------------------------------------------------------------------------------- PyTorch references
def chain_eager(x):
    """The lab's elementwise chain in eager PyTorch: four kernels, three intermediates in memory."""
    import torch
    t = x * 2.0
    t = t + 1.0
    t = torch.sigmoid(t)
    return t * 3.0


def softmax_naive(x):
    """Row softmax from five PyTorch ops (each a pass over memory), as `naive_softmax_bytes` counts it."""
    row_max = x.max(dim=1).values
    z = x - row_max[:, None]
    num = z.exp()
    den = num.sum(dim=1)
    return num / den[:, None]


def softmax_reference(x):
    """torch.softmax over rows, computed in float64 and returned in x's dtype."""
    import torch
    return torch.softmax(x.double(), dim=-1).to(x.dtype)


# ---------------------------------------------------------------------------------------------- Triton kernels
@dataclass(frozen=True)
class _Kernels:
    triton: object
    add: object
    softmax: object
    chain: object


@functools.lru_cache(maxsize=1)
def _kernels() -> _Kernels:
    """Import triton (after TRITON_INTERPRET is set where there is no GPU) and define the kernels once."""
    from common.core.env import current
    env = current()  # runs setup on first use, which sets TRITON_INTERPRET=1 on a CPU-only machine
    if env.triton_mode == "unavailable":
        raise RuntimeError("triton is not installed here: the Triton kernels of lab 03 cannot run "
                           "(install triton, or run on a Linux machine)")
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
        pid = tl.program_id(axis=0)                      # which block of the vector this program handles
        offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_elements                      # the last block may run past the end
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + y, mask=mask)

    @triton.jit
    def softmax_kernel(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
        row = tl.program_id(axis=0)                      # one program per row
        cols = tl.arange(0, BLOCK_SIZE)                  # BLOCK_SIZE >= n_cols, a power of two
        mask = cols < n_cols
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf"))  # the one read
        z = x - tl.max(x, axis=0)                        # subtract the row max: exp never overflows
        num = tl.exp(z)
        out = num / tl.sum(num, axis=0)
        tl.store(out_ptr + row * out_row_stride + cols, out, mask=mask)  # the one write

    @triton.jit
    def chain_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
        pid = tl.program_id(axis=0)
        offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_elements
        x = tl.load(x_ptr + offsets, mask=mask)          # read once
        t = tl.sigmoid(x * 2.0 + 1.0) * 3.0              # four ops, intermediates in registers
        tl.store(out_ptr + offsets, t, mask=mask)        # write once

    return _Kernels(triton, add_kernel, softmax_kernel, chain_kernel)


def kernel_source(name: str) -> str:
    """The Python source of one of this module's Triton kernels: "add", "softmax" or "chain"."""
    names = ("add", "softmax", "chain")
    if name not in names:
        raise ValueError(f"name={name!r} is not a kernel here; allowed: {', '.join(names)}")
    import ast
    import textwrap
    src = textwrap.dedent(inspect.getsource(_kernels))  # read, not run: no Triton needed to show a kernel
    lines = src.splitlines(keepends=True)
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef) and node.name == f"{name}_kernel":
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            return textwrap.dedent("".join(lines[start - 1:node.end_lineno]))
    raise LookupError(f"no {name}_kernel in fusion._kernels")


def default_block_size() -> int:
    """1024 elements per program when compiled; 16384 under the interpreter, whose cost is per program."""
    from common.core.env import current
    return 16384 if current().triton_mode == "interpreted" else 1024


def _check_block(block_size: int) -> int:
    if block_size is None:
        return default_block_size()
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1 or \
            block_size & (block_size - 1):
        raise ValueError(f"block_size={block_size!r} must be a power of two (tl.arange needs one), e.g. 1024")
    return block_size


def _check_tensor(name: str, t, ndim: int | None = None) -> None:
    import torch
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")


def _check_pair(name_a, a, name_b, b) -> None:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"{name_b} must match {name_a} in shape, dtype and device: {name_a} is "
                         f"{tuple(a.shape)} {a.dtype} on {a.device}, {name_b} is {tuple(b.shape)} {b.dtype} on "
                         f"{b.device}")


def _flat(name: str, t):
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (the kernel walks it as a flat vector); call .contiguous()")
    return t


def _launch_elementwise(kernel: str, inputs: dict, out, block_size: int | None):
    """Check the tensors, allocate `out` like the first input if needed, and launch one program per block over the
    flattened elements (the last block masked inside the kernel)."""
    first_name, first = next(iter(inputs.items()))
    _check_tensor(first_name, first)
    if out is None:
        import torch
        out = torch.empty_like(first)
    _check_tensor("out", out)
    _check_pair(first_name, first, "out", out)
    block = _check_block(block_size)
    k = _kernels()
    n = first.numel()
    if n:
        flat = [_flat(name, t) for name, t in inputs.items()]
        getattr(k, kernel)[(k.triton.cdiv(n, block),)](*flat, _flat("out", out), n, BLOCK_SIZE=block)
    return out


def vector_add(x, y, out=None, block_size: int | None = None):
    """out = x + y with the Triton kernel: one program per block of `block_size` elements, the last one masked."""
    _check_tensor("x", x)
    _check_tensor("y", y)
    _check_pair("x", x, "y", y)
    return _launch_elementwise("add", {"x": x, "y": y}, out, block_size)


def softmax_num_warps(block_size: int) -> int:
    """Warps per row program: more for long rows, so each thread holds a handful of elements."""
    return 4 if block_size < 2048 else 8 if block_size < 8192 else 16


def softmax(x, out=None):
    """Row softmax of a 2-D tensor with the fused Triton kernel: each row read once, written once."""
    _check_tensor("x", x, ndim=2)
    rows, cols = x.shape
    if cols > MAX_SOFTMAX_COLS:
        raise ValueError(f"x has {cols} columns; this one-row-per-program kernel allows at most "
                         f"{MAX_SOFTMAX_COLS} (a longer row does not fit in one program's registers)")
    if out is None:
        import torch
        out = torch.empty_like(x)
    _check_tensor("out", out, ndim=2)
    _check_pair("x", x, "out", out)
    if x.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("x and out must have unit stride along the columns (rows may be strided)")
    if rows and cols:
        k = _kernels()
        block = k.triton.next_power_of_2(cols)
        k.softmax[(rows,)](x, out, x.stride(0), out.stride(0), cols, BLOCK_SIZE=block,
                           num_warps=softmax_num_warps(block))
    return out


def chain_fused(x, out=None, block_size: int | None = None):
    """`chain_eager(x)` in one Triton kernel: one read of x, one write of out."""
    return _launch_elementwise("chain", {"x": x}, out, block_size)


# ---------------------------------------------------------------------------------------------- torch.compile
@dataclass
class GeneratedKernel:
    name: str  # e.g. cpp_fused_add_mul_sigmoid_0 (CPU, C++) or triton_poi_fused_add_mul_sigmoid_0 (GPU, Triton)
    language: str  # "C++" or "Triton"
    source: str


_CPP_RE = re.compile(r"^(\w+) = async_compile\.cpp\w*\(.*?r'''\n(.*?)'''", re.S | re.M)
_TRITON_RE = re.compile(r"^(\w+) = async_compile\.triton\(\s*'(\w+)',\s*'''\s*\n(.*?)'''\s*,\s*device_str=",
                        re.S | re.M)


def generated_kernels(code: str) -> list[GeneratedKernel]:
    """The kernels in the Python module Inductor wrote for a compiled function (one per fused group of ops)."""
    if not isinstance(code, str):
        raise ValueError(f"code must be the generated module's source (a str), got {type(code).__name__}")
    found = [GeneratedKernel(m.group(1), "C++", m.group(2).strip()) for m in _CPP_RE.finditer(code)]
    for m in _TRITON_RE.finditer(code):
        src = m.group(3)
        start = src.find("@triton.jit")
        found.append(GeneratedKernel(m.group(1), "Triton", (src[start:] if start >= 0 else src).strip()))
    return found


def explain(fn, *args) -> dict:
    """What TorchDynamo captures from `fn(*args)` before any code is generated (`torch._dynamo.explain`):
    graph_count, graph_break_count, op_count and the first captured FX graph's code."""
    import torch
    out = torch._dynamo.explain(fn)(*args)
    code = out.graphs[0].code.strip() if out.graphs else ""
    return {"graph_count": out.graph_count, "graph_break_count": out.graph_break_count, "op_count": out.op_count,
            "graph_code": code}


def compile_and_capture(fn, *args):
    """torch.compile `fn`, run it once on `args` and capture what Inductor generated.

    Returns (compiled_fn, result, kernels): the compiled function (reuse it: the first call paid the compile),
    its result, and the generated kernels (`generated_kernels`). Compile once per input shape: a new shape recompiles.
    """
    import torch
    from torch._inductor.utils import run_and_get_code
    compiled = torch.compile(fn)
    result, codes = run_and_get_code(compiled, *args)
    kernels = [k for code in codes for k in generated_kernels(code)]
    if not kernels:  # a wrapper format this parser does not know: show the whole generated module instead
        kernels = [GeneratedKernel("generated_module", "Python", code) for code in codes]
    return compiled, result, kernels


# ---------------------------------------------------------------------------------------------- measurement
def measure(label: str, fn, *args, min_bytes: int, modelled_bytes: int | None = None, copy_gbps: float,
            kernels: int | None = None, min_run_time: float = 0.2, **extra) -> dict:
    """Time `fn(*args)` with `common.core.timing.bench`; one table row.

    `min_bytes` is what the computation must move at least (its input read once, its output written once);
    `fraction_of_copy_bw` is min_bytes / time over the copy bandwidth -- the same work for every implementation,
    so a higher fraction is a faster implementation. It uses the fastest timed block, like the copy ceiling it is
    divided by (`copy_ceiling_gbps`): best against best, so a busy moment during either moves neither much.
    `modelled_bytes` is what this implementation moves by the model (intermediates included); its GB/s (at the
    median time) shows how busy the memory system was.
    """
    from common.core import timing
    t = timing.bench(fn, *args, label=label, min_run_time=min_run_time)
    row = {"implementation": label, **extra}
    if kernels is not None:
        row["kernels"] = kernels
    moved = modelled_bytes if modelled_bytes is not None else min_bytes
    row.update({"MB moved (model)": moved / 1e6, "time_ms": t.ms, "iqr_%": 100 * t.spread,
                "GB/s moved": moved / t.median_s / 1e9,
                "fraction_of_copy_bw": fraction_of_copy_bw(min_bytes, t.best_s, copy_gbps)})
    return row


# ---------------------------------------------------------------------------------------------- controlled timing

class torch_threads:
    """`with torch_threads(1): ...` runs PyTorch (and Inductor's OpenMP loops) on `n` threads, then restores the count.
    On a small shared CPU one thread removes the OpenMP hand-off that makes two-thread timings of small kernels jump."""

    def __init__(self, n: int):
        whole("n", n, 1)
        self.n = n

    def __enter__(self):
        import torch
        self.before = torch.get_num_threads()
        torch.set_num_threads(self.n)
        return self

    def __exit__(self, *exc):
        import torch
        torch.set_num_threads(self.before)
        return False


def copy_ceiling_gbps(nbytes: int, device=None, rounds: int = 3, min_run_time: float = 0.05) -> float:
    """The copy ceiling for a kernel that moves `nbytes` (read + write): the fastest block of `rounds` timings of a
    copy that moves the same bytes (a float32 buffer of nbytes / 2 copied into another), in GB/s, at the current thread count.
    Same bytes, same cache level, same threads and the same per-call overhead as the kernel compared with it, so a
    kernel cannot exceed it by more than timing noise (a DRAM-sized copy would be beaten by any cache-resident one)."""
    import torch

    from common.core import timing
    from common.core.env import current
    whole("nbytes", nbytes, 8)
    whole("rounds", rounds, 1)
    dev = device or current().device
    src = torch.randn(nbytes // 8, device=dev)
    dst = torch.empty_like(src)
    moved = 2 * src.numel() * src.element_size()
    best = min(timing.bench(dst.copy_, src, min_run_time=min_run_time, device=str(dev)).best_s
               for _ in range(rounds))
    return moved / best / 1e9


def interleaved_speedup(fn_slow, fn_fast, *args, rounds: int = 5, min_run_time: float = 0.05) -> dict:
    """Time the two functions in turn, `rounds` times (so a burst of load hits both alike); return the per-round
    ratios slow/fast, their median and minimum, and each function's median time in seconds."""
    import statistics

    from common.core import timing
    whole("rounds", rounds, 1)
    slow, fast = [], []
    for _ in range(rounds):
        slow.append(timing.bench(fn_slow, *args, min_run_time=min_run_time).median_s)
        fast.append(timing.bench(fn_fast, *args, min_run_time=min_run_time).median_s)
    ratios = [s / f for s, f in zip(slow, fast)]
    return {"median": statistics.median(ratios), "min": min(ratios), "ratios": ratios,
            "slow_s": statistics.median(slow), "fast_s": statistics.median(fast)}

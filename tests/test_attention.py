"""common.kernels.attention: every implementation against SDPA, byte counts against their closed forms, bad input."""
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import math  # noqa: E402

import pytest  # noqa: E402

from common.kernels import attention as A


def _qkv(b, h, n, d, dtype=torch.float32, device="cpu", scale=1.0):
    return (torch.randn(b, h, n, d, dtype=dtype, device=device) * scale,
            torch.randn(b, h, n, d, dtype=dtype, device=device),
            torch.randn(b, h, n, d, dtype=dtype, device=device))


def _rel(got, ref):
    return ((got.double().cpu() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, d", [(1, 16), (37, 32), (128, 64), (77, 128)])
def test_naive_and_tiled_match_sdpa(n, d, causal):
    q, k, v = _qkv(2, 2, n, d)
    ref = A.reference_attention(q, k, v, causal)
    assert _rel(A.naive_attention(q, k, v, causal), ref) < 1e-5
    for bm, bn in [(16, 16), (32, 16), (16, 48), (n, n)]:
        assert _rel(A.tiled_attention(q, k, v, bm, bn, causal), ref) < 1e-5


def test_tiled_float64_and_large_scores():
    q, k, v = _qkv(1, 1, 90, 32, torch.float64, scale=100.0)
    ref = A.reference_attention(q, k, v)
    assert _rel(A.tiled_attention(q, k, v, 32, 32), ref) < 1e-12
    q, k, v = _qkv(1, 1, 90, 32, scale=100.0)  # exp(score) alone would overflow float32
    assert torch.isfinite(A.tiled_attention(q, k, v, 32, 32)).all()


def test_online_softmax():
    x = torch.randn(7, 333) * 50
    assert torch.allclose(A.online_softmax(x, 50), torch.softmax(x, -1), atol=1e-6)
    m, l = A.online_softmax_stats(x[:, j:j + 64] for j in range(0, 333, 64))
    assert torch.allclose(m, x.amax(-1))
    assert torch.allclose(l, torch.exp(x - x.amax(-1, keepdim=True)).sum(-1), rtol=1e-5)
    with pytest.raises(ValueError, match="empty"):
        A.online_softmax_stats(iter([]))
    with pytest.raises(ValueError, match="block"):
        A.online_softmax(x, 0)


def test_flops():
    assert A.attention_flops(2, 3, 5, 7) == 4 * 2 * 3 * 25 * 7
    assert A.attention_flops(2, 3, 5, 8, causal=True) == 2 * 2 * 3 * 25 * 8
    with pytest.raises(ValueError, match="seq_len=0"):
        A.attention_flops(1, 1, 0, 64)


def test_recorded_io_figures():
    # N=4096, d=64, one head, fp16, M = 100 KiB: the two numbers the lab records
    assert A.standard_io_bytes(4096, 64, 2) == 2 * (4 * 4096 * 64 + 4 * 4096 ** 2) == 136_314_880
    assert A.blocks_for_memory(100 * 1024, 64, 2) == (160, 64)
    assert A.flash_io_bytes(4096, 64, 100 * 1024, 2) == 2 * (2 * 4096 * 64 + 26 * 2 * 4096 * 64) == 28_311_552


@pytest.mark.parametrize("n", [1, 100, 1000, 4096])
@pytest.mark.parametrize("d", [32, 64, 128])
def test_counts_equal_closed_forms(n, d):
    assert A.count_standard_bytes(n, d) == A.standard_io_bytes(n, d)
    for sram in (16 * 1024, 100 * 1024, 228 * 1024):
        bm, bn = A.blocks_for_memory(sram, d)
        assert A.on_chip_bytes(bm, bn, d) <= sram
        assert A.count_flash_bytes(n, d, bm, bn) == A.flash_io_bytes(n, d, sram)
    assert A.count_flash_bytes(n, d, 64, 32, elem_bytes=4, heads=3, batch=2) == \
        A.flash_io_bytes(n, d, block_m=64, elem_bytes=4, heads=3, batch=2)


def test_count_real_run_equals_meta_run():
    q, k, v = _qkv(1, 2, 150, 32)
    c = A.HBMCounter()
    A.tiled_attention(q, k, v, 64, 32, counter=c)
    assert c.total == A.count_flash_bytes(150, 32, 64, 32, elem_bytes=4, heads=2)
    c2 = A.HBMCounter()
    A.tiled_attention(q, k, v, 64, 32, causal=True, counter=c2)
    assert c2.total == A.count_flash_bytes(150, 32, 64, 32, elem_bytes=4, heads=2, causal=True) < c.total


def test_theorem_2_shape():
    # tiled bytes / (N^2 d^2 / M) stays near 10 (2 N d per pass, N / (M / 5d) passes) once N >> block_m
    ratios = []
    for n, d, sram in [(4096, 64, 100 * 1024), (8192, 64, 100 * 1024), (4096, 128, 100 * 1024),
                       (8192, 64, 200 * 1024), (16384, 32, 64 * 1024)]:
        ratios.append(A.flash_io_bytes(n, d, sram) / A.flash_io_theta(n, d, sram))
    assert all(9 < r < 12 for r in ratios), ratios
    # doubling M roughly halves the traffic; standard attention does not care about M
    assert 0.45 < A.flash_io_bytes(8192, 64, 200 * 1024) / A.flash_io_bytes(8192, 64, 100 * 1024) < 0.56


def test_bad_input():
    q, k, v = _qkv(1, 1, 8, 16)
    with pytest.raises(ValueError, match="4 dims"):
        A.naive_attention(q[0], k, v)
    with pytest.raises(ValueError, match="do not fit"):
        A.tiled_attention(q, k[..., :8], v)
    with pytest.raises(ValueError, match="block_m=0"):
        A.tiled_attention(q, k, v, 0, 16)
    with pytest.raises(ValueError, match="cannot hold"):
        A.blocks_for_memory(100, 64)
    with pytest.raises(ValueError, match=r"on-chip memory M\) or block_m"):
        A.flash_io_bytes(1024, 64)
    with pytest.raises(ValueError, match="elem_bytes=3"):
        A.count_flash_bytes(16, 16, 8, 8, elem_bytes=3)
    with pytest.raises(ValueError, match="head_dim=24"):
        A.flash_attention(*_qkv(1, 1, 8, 24))
    with pytest.raises(ValueError, match="multiple of block_n"):
        A.flash_attention(q, k, v, block_m=32, block_n=64)


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, d", [(64, 64), (100, 64), (129, 64), (70, 128), (5, 32)])
def test_triton_forward_float32(n, d, causal):
    if _device() == "cuda":
        pytest.skip("float32 tl.dot uses TF32 on a GPU; the bf16/fp16 test covers the GPU")
    q, k, v = _qkv(1, 2, n, d)
    ref = A.reference_attention(q, k, v, causal)
    assert _rel(A.flash_attention(q, k, v, causal), ref) < 1e-5
    assert _rel(A.flash_attention(q, k, v, causal, block_m=64, block_n=32), ref) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, d", [(1024, 64), (1000, 128), (4096, 128)])
def test_triton_forward_gpu(n, d, causal, dtype):
    q, k, v = _qkv(2, 4, n, d, dtype, "cuda")
    ref = A.reference_attention(q, k, v, causal)
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-2
    assert _rel(A.flash_attention(q, k, v, causal), ref) < tol
    assert _rel(A.sdpa(q, k, v, causal), ref) < tol


def test_launch_forward_reports_a_stub_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def stub(Q, K, V, O, sm_scale, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CAUSAL: tl.constexpr):
        raise NotImplementedError("Exercise 4.4: replace this line with your code")

    with pytest.raises(NotImplementedError, match="stub"):
        A.launch_forward(stub, *_qkv(1, 1, 8, 16))


def test_flops_formula_matches_bench_convention():
    assert math.isclose(A.attention_flops(1, 1, 4096, 128) / 1e12, 4 * 4096 ** 2 * 128 / 1e12)


def test_kernel_compiles_for_hopper_without_a_gpu():
    """Ahead-of-time compile for sm_90 in a fresh process (no interpreter): catches code that only the interpreter
    accepts. Skipped when Triton's NVIDIA backend (with its ptxas) is not installed."""
    import subprocess
    import sys
    from pathlib import Path
    script = (
        "import sys; sys.path.insert(0, '.')\n"
        "from common.kernels import attention as A\n"
        "for causal in (False, True):\n"
        "    c = A.compile_for_gpu(90, head_dim=128, causal=causal)\n"
        "    ptx = c.asm['ptx']\n"
        "    assert '.target sm_90' in ptx and 0 < c.metadata.shared <= 227 * 1024, c.metadata.shared\n"
        "    assert 'wgmma.mma_async' in ptx, 'no Hopper tensor-core instructions'\n"
        "    assert 'cp.async' in ptx, 'K/V loads are not software-pipelined (num_stages=3)'\n"
        "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    if r.returncode and ("No module named 'triton.backends.nvidia" in r.stderr or "ptxas" in r.stderr.lower()):
        pytest.skip("Triton's NVIDIA backend / ptxas is not available here")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


def test_compile_for_gpu_refuses_the_interpreter():
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("only meaningful under the interpreter")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        A.compile_for_gpu()


# ---------------------------------------------------------------------------------------------------------------- backward

def _grads_ref(q, k, v, do, causal):
    q64, k64, v64 = (t.detach().double().cpu().requires_grad_() for t in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal).backward(do.double().cpu())
    return q64.grad, k64.grad, v64.grad


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, bm, bn", [(1, 16, 16), (100, 32, 16), (77, 16, 48), (64, 64, 64)])
def test_tiled_backward_matches_autograd(n, bm, bn, causal):
    q, k, v = _qkv(2, 2, n, 32, torch.float64)
    do = torch.randn_like(q)
    o, lse = A.tiled_attention(q, k, v, bm, bn, causal, return_lse=True)
    ref_lse = torch.logsumexp((q @ k.transpose(-2, -1) * 32 ** -0.5).masked_fill(
        ~A.causal_mask(n, n), float("-inf")) if causal else q @ k.transpose(-2, -1) * 32 ** -0.5, -1)
    assert torch.allclose(lse, ref_lse, atol=1e-12)
    for got, ref in zip(A.tiled_attention_backward(q, k, v, o, lse, do, bm, bn, causal), _grads_ref(q, k, v, do, causal)):
        assert (got - ref).abs().max() < 1e-12


@pytest.mark.parametrize("n", [1, 100, 1000])
def test_backward_counts_equal_closed_form(n):
    for d, bm, bn, e in [(64, 64, 32, 2), (128, 32, 64, 2), (32, 16, 16, 4), (16, 8, 24, 8)]:
        assert A.count_flash_bwd_bytes(n, d, bm, bn, elem_bytes=e, heads=2) == \
            A.flash_bwd_io_bytes(n, d, bn, elem_bytes=e, heads=2)
    assert A.count_flash_bwd_bytes(n, 64, 64, 32, causal=True) <= A.count_flash_bwd_bytes(n, 64, 64, 32)
    # the backward moves about 2-3x the forward's bytes at equal blocks, N >> block
    if n >= 1000:
        assert 2 < A.flash_bwd_io_bytes(n, 64, 64) / A.flash_io_bytes(n, 64, block_m=64) < 3.5


def test_backward_count_real_run_equals_meta_run():
    q, k, v = _qkv(1, 2, 150, 32)
    do = torch.randn_like(q)
    o, lse = A.tiled_attention(q, k, v, 64, 32, return_lse=True)
    c = A.HBMCounter()
    A.tiled_attention_backward(q, k, v, o, lse, do, 64, 32, counter=c)
    assert c.total == A.count_flash_bwd_bytes(150, 32, 64, 32, elem_bytes=4, heads=2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, d, blocks", [(100, 32, None), (37, 64, None), (130, 16, {"dkdv": (16, 32), "dq": (32, 16)}),
                                          (5, 32, {"dkdv": (32, 16), "dq": (16, 32)})])
def test_triton_backward_float32(n, d, blocks, causal):
    if _device() == "cuda":
        pytest.skip("float32 tl.dot uses TF32 on a GPU; the bf16 test covers the GPU")
    q, k, v = _qkv(1, 2, n, d)
    do = torch.randn_like(q)
    o, lse = A.flash_attention(q, k, v, causal, return_lse=True)
    for got, ref in zip(A.flash_attention_backward(q, k, v, o, lse, do, causal, blocks=blocks),
                        _grads_ref(q, k, v, do, causal)):
        assert _rel(got, ref) < 1e-5


def test_flash_attn_func_autograd():
    q, k, v = (t.requires_grad_() for t in _qkv(1, 1, 40, 16))
    A.flash_attn_func(q, k, v, True).sum().backward()
    ref = _grads_ref(q, k, v, torch.ones(1, 1, 40, 16), True)
    assert max(_rel(t.grad, r) for t, r in zip((q, k, v), ref)) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, d", [(1000, 64), (1024, 128)])
def test_triton_backward_gpu_bf16(n, d, causal):
    q, k, v = _qkv(2, 4, n, d, torch.bfloat16, "cuda")
    do = torch.randn_like(q)
    o, lse = A.flash_attention(q, k, v, causal, return_lse=True)
    for got, ref in zip(A.flash_attention_backward(q, k, v, o, lse, do, causal), _grads_ref(q, k, v, do, causal)):
        assert _rel(got, ref) < 5e-2


def test_shared_memory_from_data_and_pruning():
    assert A.smem_per_block_bytes("H200-SXM") == 227 * 1024
    assert A.smem_per_block_bytes("A100-SXM") == 163 * 1024
    limit = A.smem_per_block_bytes("H100-SXM")
    fwd256 = A.fitting_configs("fwd", 256, limit)
    assert fwd256 and len(fwd256) < len(A.GPU_CONFIGS)
    assert all(A.smem_estimate_bytes("fwd", c[0], c[1], 256, c[3]) <= limit for c in fwd256)
    assert len(A.fitting_configs("fwd", 128, limit)) == len(A.GPU_CONFIGS)
    with pytest.raises(ValueError, match="head_dim=256: no fwd configuration fits in 40 KiB"):
        A.fitting_configs("fwd", 256, 40 * 1024)
    with pytest.raises(ValueError, match="kind='bwd'"):
        A.fitting_configs("bwd", 64, limit)


def test_backward_kernels_compile_for_hopper_without_a_gpu():
    """sm_90 ahead-of-time compile of the backward kernels and the d=256 forward (fresh process, no interpreter):
    Triton's shared memory equals (dkdv: stays under) this module's estimate, the estimate's verdict matches the
    per-block limit, and a d=128 configuration spills no registers."""
    import subprocess
    import sys
    from pathlib import Path
    script = (
        "import sys; sys.path.insert(0, '.')\n"
        "from common.kernels import attention as A\n"
        "lim = A.smem_per_block_bytes('H200-SXM')\n"
        "for kind, d, cfg in [('dkdv', 128, A.BWD_GPU_CONFIGS['dkdv'][0]), ('dq', 128, A.BWD_GPU_CONFIGS['dq'][0]),\n"
        "                     ('fwd', 256, (128, 64, 8, 3)), ('fwd', 256, (64, 32, 4, 4))]:\n"
        "    bm, bn, w, st = cfg\n"
        "    c = A.compile_for_gpu(90, head_dim=d, causal=True, block_m=bm, block_n=bn, num_warps=w, num_stages=st,\n"
        "                          kind=kind)\n"
        "    est = A.smem_estimate_bytes(kind, bm, bn, d, st)\n"
        "    assert c.metadata.shared <= est <= c.metadata.shared * 1.01, (kind, d, cfg, c.metadata.shared, est)\n"
        "    assert (c.metadata.shared <= lim) == (est <= lim)\n"
        "    rs = A.registers_and_spills(c)\n"
        "    print(kind, d, cfg, c.metadata.shared, rs)\n"
        "    if d == 128: assert rs['spill_stores'] == 0, rs\n"
        "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode and ("No module named 'triton.backends.nvidia" in r.stderr or "ptxas" in r.stderr.lower()):
        pytest.skip("Triton's NVIDIA backend / ptxas is not available here")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


def _dispatch_bytes(fn, *args):
    """Bytes read and written by every aten op `fn` runs (views excluded): what eager PyTorch moves, op by op."""
    from torch.utils._python_dispatch import TorchDispatchMode
    views = {"view", "_unsafe_view", "t", "transpose", "slice", "expand", "detach", "alias", "select", "unsqueeze",
             "permute", "as_strided", "squeeze", "lift_fresh", "empty_like", "empty"}

    class Count(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ not in views:
                for t in [*args, *(kwargs or {}).values(), *(out if isinstance(out, (tuple, list)) else (out,))]:
                    if isinstance(t, torch.Tensor):
                        Count.total += t.numel() * t.element_size()
            return out

    with Count():
        fn(*args)
    return Count.total


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_roofline_bytes_are_what_eager_moves(dtype):
    q, k, v = _qkv(1, 2, 128, 32, dtype)
    e = q.element_size()
    assert _dispatch_bytes(A.naive_attention, q, k, v) == A.naive_moved_bytes(128, 32, e, heads=2)
    causal = _dispatch_bytes(A.naive_attention, q, k, v, True)
    assert abs(causal - A.naive_moved_bytes(128, 32, e, heads=2, causal=True)) / causal < 0.01
    tiled = _dispatch_bytes(A.tiled_attention, q, k, v, 32, 16)
    assert abs(tiled - A.tiled_eager_bytes(128, 32, 32, 16, e, heads=2)) / tiled < 0.1
    # both are far above the algorithms' counts that the roofline used before
    assert A.naive_moved_bytes(4096, 64, 2) > 3 * A.standard_io_bytes(4096, 64, 2)
    assert A.tiled_eager_bytes(4096, 64, 128, 128, 2) > 10 * A.flash_io_bytes(4096, 64, block_m=128)

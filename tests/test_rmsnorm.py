"""common.kernels.rmsnorm: the fused residual add + RMSNorm (interpreted on a CPU) against float64 and eager PyTorch,
the bytes each moves, and the comparison the notebook times on a GPU (run here at a tiny size)."""
from common.core.env import setup

setup("test", quiet=True)  # before anything imports triton: TRITON_INTERPRET=1 where there is no GPU

import pytest  # noqa: E402
import torch  # noqa: E402

from common.core.env import current  # noqa: E402
from common.kernels import fusion, rmsnorm  # noqa: E402

DEV = current().device


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 1.6e-2)])
def test_fused_matches_float64_and_updates_the_residual(dtype, tol):
    x, r, w = rmsnorm.inputs(3, 100, dtype, DEV, seed=1)
    res = r.clone()
    out = rmsnorm.add_rmsnorm(x, res, w)
    y_ref, h_ref = rmsnorm.reference(x, r, w)
    assert torch.allclose(out.double(), y_ref, rtol=tol, atol=tol) and out.dtype == dtype
    assert torch.allclose(res.double(), h_ref, rtol=tol, atol=tol)
    eager_res = r.clone()  # eager PyTorch gives the same
    assert torch.allclose(rmsnorm.add_rmsnorm_eager(x, eager_res, w).double(), y_ref, rtol=tol, atol=tol)
    assert torch.equal(eager_res, res) or torch.allclose(eager_res.double(), h_ref, rtol=tol, atol=tol)


def test_fused_strided_rows():
    x, r, w = rmsnorm.inputs(4, 37, torch.float32, DEV, seed=2)
    wide_x, wide_r = torch.zeros(4, 50, device=DEV), torch.zeros(4, 45, device=DEV)
    xs, rs = wide_x[:, :37], wide_r[:, :37]
    xs.copy_(x)
    rs.copy_(r)
    out = rmsnorm.add_rmsnorm(xs, rs, w)
    y_ref, h_ref = rmsnorm.reference(x, r, w)
    assert torch.allclose(out.double(), y_ref, rtol=1e-5, atol=1e-5)
    assert torch.allclose(rs.double(), h_ref, rtol=1e-5, atol=1e-5) and not wide_r[:, 37:].any()


@pytest.mark.parametrize("call, match", [
    (lambda x, r, w: rmsnorm.add_rmsnorm(x, r[:, :3], w), "x and residual must be"),
    (lambda x, r, w: rmsnorm.add_rmsnorm(x.t(), r.t(), torch.ones(2)), "unit stride"),
    (lambda x, r, w: rmsnorm.add_rmsnorm(x, r, w, eps=-1.0), "eps=-1.0"),
    (lambda x, r, w: rmsnorm.add_rmsnorm(x.tolist(), r, w), "x must be a torch.Tensor"),
    (lambda x, r, w: rmsnorm.fused_bytes(-1, 4, 2), "rows=-1"),
    (lambda x, r, w: rmsnorm.inputs(0, 4, torch.float32, "cpu"), "rows=0"),
])
def test_bad_input_is_named(call, match):
    x, r, w = rmsnorm.inputs(2, 8, torch.float32, DEV)
    with pytest.raises(ValueError, match=match):
        call(x, r, w)


def test_bytes_eager_vs_fused():
    """Eager (one kernel per op, counted at dispatch on meta tensors) moves 42 bytes per element in bf16, the fused
    kernel 8 (4 tensors of 2 bytes): 5.25x."""
    rows, hidden = 64, 256
    meta = [torch.empty(rows, hidden, dtype=torch.bfloat16, device="meta") for _ in range(2)]
    kernels, nbytes = fusion.eager_traffic(rmsnorm.add_rmsnorm_eager, *meta,
                                           torch.empty(hidden, dtype=torch.bfloat16, device="meta"))
    assert kernels == 9
    assert abs(nbytes - 42 * rows * hidden) < 64 * rows + 8 * hidden
    assert rmsnorm.fused_bytes(rows, hidden, 2) == (4 * rows * hidden + hidden) * 2


def test_compare_times_each_on_its_own_residual():
    x, r, w = rmsnorm.inputs(4, 64, torch.float32, DEV)
    before = r.clone()
    out = torch.empty_like(x)
    rows = rmsnorm.compare({"eager": lambda a, b, c: rmsnorm.add_rmsnorm_eager(a, b, c),
                            "fused": lambda a, b, c: rmsnorm.add_rmsnorm(a, b, c, out)},
                           x, r, w, copy_gbps=10.0, min_run_time=0.01)
    assert set(rows) == {"eager", "fused"} and torch.equal(r, before)
    assert all(row["time_ms"] > 0 and row["fraction_of_copy_bw"] > 0 for row in rows.values())

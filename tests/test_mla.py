"""common.kernels.mla (three forms of MLA agree) and common.kernels.mla_decode (the Triton paged decode kernel against
the float64 reference, under the interpreter on a CPU; compiled on a GPU)."""
import math
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest  # noqa: E402

from common.facts import models
from common.kernels import mla, mla_decode


def _case(dims, T, Q, seed, dtype=torch.float64):
    return mla.random_case(dims, T, Q, torch.Generator().manual_seed(seed), dtype)


@pytest.mark.parametrize("T, Q", [(1, 1), (7, 1), (33, 3), (64, 2)])
def test_three_forms_agree_in_float64(T, Q):
    d = mla.MLADims(4, 24, 12, 8, 10)
    r = mla.three_ways(_case(d, T, Q, T))
    assert r["absorbed_vs_decompressed"] < 1e-12 and r["mqa_vs_absorbed"] < 1e-12


def test_three_forms_agree_at_deepseek_v3_size_in_float32():
    d = mla.MLADims.from_config(models.load_model_config("deepseek_v3"))
    assert (d.heads, d.latent_width, d.qk_dim) == (128, 576, 192) and math.isclose(d.scale, 192 ** -0.5)
    d = mla.MLADims(16, d.kv_lora, d.nope, d.rope, d.v_dim)        # V3's head, 16 of its 128 heads
    c = _case(d, 200, 1, 0, torch.float32)
    r = mla.three_ways(c)
    ref = mla.decompressed(*[c[k].double() for k in ("q_nope", "q_rope", "latent", "k_rope", "w_uk", "w_uv")])
    assert r["absorbed_vs_decompressed"] < 1e-4 and r["mqa_vs_absorbed"] < 1e-4
    assert float((r["outputs"]["mqa"].double() - ref).abs().max()) < 1e-5


def test_yarn_mscale_of_deepseek_v3():
    """model.py: softmax_scale = qk_head_dim ** -0.5, x mscale^2 when max_seq_len (16,384) > original (4,096)."""
    v3 = models.load_model_config("deepseek_v3")
    assert v3["rope_scaling"]["factor"] == 40 and v3.inference["max_seq_len"] == 16384
    assert hash(tuple(sorted(v3.values.items())))           # configs stay usable as cache keys (lab 13's step model)
    with pytest.raises(TypeError, match=r"read-only"):
        v3["rope_scaling"]["factor"] = 4
    d = mla.MLADims.from_config(v3)
    assert math.isclose(d.mscale, 0.1 * math.log(40) + 1) and round(d.mscale ** 2, 3) == 1.874
    assert math.isclose(d.softmax_scale, 1.8738542070926265 / math.sqrt(192)) and math.isclose(d.scale, 192 ** -0.5)
    assert mla.MLADims.from_config(v3, max_seq_len=4096).mscale == 1.0              # within the original context
    assert mla.MLADims.from_config(models.load_model_config("kimi_k2")).mscale == 1.0   # no rope_scaling in data/
    assert mla.yarn_mscale(1.0) == 1.0 and math.isclose(mla.yarn_mscale(40, 0.5), 0.05 * math.log(40) + 1)
    with pytest.raises(ValueError, match=r"mscale=0 must be a finite number > 0"):
        mla.MLADims(2, 16, 8, 4, 8, mscale=0)


def test_causality_and_the_scale_matter():
    d = mla.MLADims(2, 16, 8, 4, 8)
    c = _case(d, 10, 3, 1)
    args = [c[k] for k in ("q_nope", "q_rope", "latent", "k_rope", "w_uk", "w_uv")]
    full = mla.absorbed(*args, causal=False)
    assert not torch.allclose(full, mla.absorbed(*args))
    assert torch.allclose(full[-1], mla.absorbed(*args)[-1])          # the last query sees every token anyway
    assert not torch.allclose(mla.absorbed(*args, scale=1 / math.sqrt(d.latent_width)), mla.absorbed(*args))


def test_mqa_attention_lse_and_errors():
    q, kv = torch.randn(2, 3, 20, dtype=torch.float64), torch.randn(9, 20, dtype=torch.float64)
    out, lse = mla.mqa_attention(q, kv, 16, 0.3, causal=False)
    s = torch.einsum("qhd,td->qht", q, kv) * 0.3
    assert torch.allclose(lse, torch.logsumexp(s, -1)) and out.shape == (2, 3, 16)
    with pytest.raises(ValueError, match=r"head_dim_v=21 is not allowed"):
        mla.mqa_attention(q, kv, 21, 0.3)
    with pytest.raises(ValueError, match=r"w_uk .* must be \(H, nope, kv_lora\)"):
        d = mla.MLADims(2, 16, 8, 4, 8)
        c = _case(d, 5, 1, 0)
        mla.absorbed(c["q_nope"], c["q_rope"], c["latent"], c["k_rope"], c["w_uk"].transpose(1, 2), c["w_uv"])
    with pytest.raises(ValueError, match=r"queries=4, tokens=3"):
        mla.random_case(mla.MLADims(2, 16, 8, 4, 8), 3, 4)
    with pytest.raises(ValueError, match=r"heads=0 must be an integer >= 1"):
        mla.MLADims(0, 16, 8, 4, 8)


def test_decode_costs_show_why_decode_absorbs_and_prefill_decompresses():
    d = mla.MLADims.from_config(models.load_model_config("deepseek_v3"))
    c = mla.decode_costs(d, 4989, batch=1)
    assert c["MQA over the latent (fused)"]["bytes"] < c["latent, absorbed (2 passes)"]["bytes"] < \
        c["MHA cache"]["bytes"] / 9
    assert c["latent, decompressed each step"]["flops"] > 100 * c["MQA over the latent (fused)"]["flops"]
    p = mla.prefill_core_flops(d, 4096)
    assert 3.3 < p["MQA mode"] / p["MHA mode"] < 3.5               # (576 + 512) / (192 + 128) = 3.4


# ---------------------------------------------------------------- the Triton decode kernel

def paged_case(lens, heads=16, s_q=1, d_lat=64, d_rope=16, page=16, seed=0, dtype=torch.float32, device="cpu"):
    return mla_decode.random_paged_case(lens, heads, s_q, d_lat, d_rope, page, dtype, device, seed)


@pytest.mark.parametrize("lens, s_q, heads, splits, block_n", [
    ((1, 37, 100), 1, 16, None, None),      # a one-token sequence, lengths not multiples of the page
    ((16, 64, 65), 2, 8, 3, 16),            # MTP: 2 queries, causal inside the last tokens; 8 heads x 2 = 16 rows
    ((200,), 1, 20, 5, None),               # rows not a multiple of block_h (20 of 32): masked
    ((3, 50, 130, 9), 1, 16, 8, 16),        # more splits than some sequences have pages: empty splits
])
def test_triton_decode_matches_reference(lens, s_q, heads, splits, block_n):
    q, kv, table, seq = paged_case(lens, heads, s_q)
    out, lse = mla_decode.mla_decode(q, kv, table, seq, head_dim_v=64, scale=0.125, num_splits=splits,
                                     block_n=block_n)
    ref_o, ref_l = mla_decode.paged_reference(q, kv, table, seq, 64, 0.125)
    assert out.shape == (len(lens), s_q, heads, 64) and lse.shape == (len(lens), s_q, heads)
    assert float((out.double() - ref_o).abs().max()) < 1e-4
    assert float((lse.double() - ref_l).abs().max()) < 1e-4
    torch_o = mla_decode.paged_attention(q, kv, table, seq, 64, 0.125)
    assert float((torch_o.double() - ref_o).abs().max()) < 1e-4


def test_triton_decode_at_flashmla_width():
    """576 / 512 (DeepSeek-V3), pages of 64, as FlashMLA runs it: 16 heads, and V3's 128 heads x MTP's 2 tokens in
    four 64-row blocks with the YaRN-scaled softmax scale, against the float64 reference."""
    q, kv, table, seq = paged_case((70, 129), heads=16, d_lat=512, d_rope=64, page=64, seed=3)
    out, _ = mla_decode.mla_decode(q, kv, table, seq, head_dim_v=512, scale=192 ** -0.5, num_splits=2)
    ref, _ = mla_decode.paged_reference(q, kv, table, seq, 512, 192 ** -0.5)
    assert float((out.double() - ref).abs().max()) < 1e-4
    scale = mla.MLADims.from_config(models.load_model_config("deepseek_v3")).softmax_scale
    q, kv, table, seq = paged_case((3, 100), heads=128, s_q=2, d_lat=512, d_rope=64, page=64, seed=4)
    q = q * 0.3                                                     # scores O(1) at the larger scale
    out, lse = mla_decode.mla_decode(q, kv, table, seq, head_dim_v=512, scale=scale)
    ref, ref_l = mla_decode.paged_reference(q, kv, table, seq, 512, scale)
    assert float((out.double() - ref).abs().max()) < 1e-4 and float((lse.double() - ref_l).abs().max()) < 1e-4


def test_decode_input_errors():
    q, kv, table, seq = paged_case((20, 40))
    with pytest.raises(ValueError, match=r"seq_lens\[1\]=40 needs 3 blocks of 16; block_table has 2"):
        mla_decode.mla_decode(q, kv, table[:, :2], seq, 64)
    bad = table.clone()
    bad[0, 1] = 99
    with pytest.raises(ValueError, match=r"block_table\[0, 1\]=99 is not a block of kv_cache"):
        mla_decode.mla_decode(q, kv, bad, seq, 64)
    with pytest.raises(ValueError, match=r"shorter than s_q=2"):
        mla_decode.paged_reference(q.repeat(1, 2, 1, 1), kv, table, torch.tensor([1, 40], dtype=torch.int32), 64)
    with pytest.raises(ValueError, match=r"head_dim_v=56 is not allowed; allowed: a power of two"):
        mla_decode.mla_decode(q, kv, table, seq, 56)
    with pytest.raises(ValueError, match=r"head_dim_k - head_dim_v=48 is not allowed"):
        mla_decode.mla_decode(q, kv, table, seq, 32)
    with pytest.raises(ValueError, match=r"block_n=48 is not allowed"):
        mla_decode.mla_decode(q, kv, table, seq, 64, block_n=48)
    with pytest.raises(ValueError, match=r"kv_cache has shape"):
        mla_decode.mla_decode(q, kv[..., :70], table, seq, 64)


def test_bytes_and_flops_counts():
    """GB/s counts the cache once, as FlashMLA's; the traffic with re-reads multiplies by the reads per step."""
    assert mla_decode.bytes_moved([100, 28], 16, 1, 576, 512, 2) == 128 * 576 * 2 + 2 * 16 * (576 + 512) * 2
    assert mla_decode.bytes_moved([100], 128, 1, 576, 512, 2) == 100 * 576 * 2 + 128 * 1088 * 2
    assert mla_decode.bytes_moved([100], 128, 1, 576, 512, 2, kv_reads=2) == 2 * 100 * 576 * 2 + 128 * 1088 * 2
    assert mla_decode.flops([4989], 128, 1, 576, 512) == 2 * 128 * 4989 * 1088
    assert round(mla_decode.kv_intensity(128)) == 242 and round(mla_decode.kv_intensity(256)) == 484


def test_reads_per_step_and_row_blocks():
    """V3's 128 heads: 2 reads of the cache at FlashMLA's 64 rows, 4 with MTP's 2 tokens; 8 and 16 at 16 rows."""
    assert (mla_decode.kv_reads(128), mla_decode.kv_reads(128, 2)) == (2, 4)
    assert (mla_decode.kv_reads(128, 1, 16), mla_decode.kv_reads(128, 2, 16)) == (8, 16)
    assert mla_decode.kv_reads(16) == 1 and mla_decode.kv_reads(20, 1) == 1
    assert [mla_decode.default_block_h(r) for r in (1, 16, 20, 33, 64, 256)] == [16, 16, 32, 64, 64, 64]


def test_plan_balances_the_work_by_length():
    """Runs of about equal length: a long sequence gets more splits, a short one fewer, none empty, every page once."""
    lens = [4096, 64, 300, 8000, 1]
    plan = mla_decode.plan_splits(lens, 64, row_blocks=2, programs=40)
    items = plan.items.tolist()
    pages = [-(-n // 64) for n in lens]
    for b, n in enumerate(pages):
        runs = [(p0, p1, sp) for s, p0, p1, sp in items if s == b]
        assert [sp for *_, sp in runs] == list(range(len(runs))) == list(range(int(plan.splits[b])))
        assert runs[0][0] == 0 and runs[-1][1] == n and all(a[1] == c[0] for a, c in zip(runs, runs[1:]))
    sizes = [p1 - p0 for _, p0, p1, _ in items]
    assert min(sizes) >= 1 and max(sizes) <= plan.pages_per_item
    assert int(plan.splits[3]) > int(plan.splits[0]) > int(plan.splits[2]) >= int(plan.splits[1]) == 1
    uniform = mla_decode.plan_splits(lens, 64, num_splits=4)       # sized by the longest: 4 runs of 32 pages at most
    assert int(uniform.splits[3]) == 4 and uniform.pages_per_item == 32 and int(uniform.splits[4]) == 1
    with pytest.raises(ValueError, match=r"seq_lens=\[0\] is not allowed"):
        mla_decode.plan_splits([0], 64)


def test_row_blocks_are_launched_first(monkeypatch):
    """Grid axis 0 is the row block: the programs that read the same run of pages are launched side by side."""
    q, kv, table, seq = paged_case((40, 90), heads=64, s_q=2, d_lat=64, d_rope=16, page=16)
    mla_decode._build_kernels()
    grids = []

    class Spy:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            grids.append(grid)
            return self.kernel[grid]
    monkeypatch.setitem(mla_decode._kernels, "split", Spy(mla_decode._kernels["split"]))
    out, _ = mla_decode.mla_decode(q, kv, table, seq, head_dim_v=64, scale=0.1)
    plan = mla_decode.plan_splits(seq, 16, 2, 4)
    assert grids == [(2, plan.items.shape[0])]                     # 128 rows in blocks of 64, then the runs
    ref, _ = mla_decode.paged_reference(q, kv, table, seq, 64, 0.1)
    assert float((out.double() - ref).abs().max()) < 1e-4


def test_decode_kernel_compiles_for_sm90():
    """The GPU launches, compiled ahead of time for an H100/H200 (no GPU needed): shared memory within the 227 KB a
    block may use; 16 rows without register spills; 64 rows compile (they spill: GPU_LAUNCH says so); the combine
    kernel without spills."""
    import subprocess
    import sys
    from pathlib import Path
    script = ("import sys; sys.path.insert(0, '.')\n"
              "from common.kernels import attention, mla_decode\n"
              "for bh in (16, 64):\n"
              "    c = mla_decode.compile_for_gpu(90, block_h=bh)\n"
              "    rs = attention.registers_and_spills(c)\n"
              "    assert '.target sm_90' in c.asm['ptx'] and c.metadata.shared <= 227 * 1024, c.metadata.shared\n"
              "    assert bh == 64 or rs['spill_stores'] == 0, (bh, rs)\n"
              "c = mla_decode.compile_for_gpu(90, kernel='combine')\n"
              "assert attention.registers_and_spills(c)['spill_stores'] == 0\n"
              "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parent.parent, env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode and ("No module named 'triton.backends.nvidia" in r.stderr or "ptxas" in r.stderr.lower()):
        pytest.skip("Triton's NVIDIA backend / ptxas is not available here")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]
    if os.environ.get("TRITON_INTERPRET") == "1":
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            mla_decode.compile_for_gpu()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_decode_bf16_gpu():
    """16 heads (one 16-row block), and V3's 128 heads x MTP's 2 tokens in 64-row blocks (the launch that spills)."""
    for heads, s_q in ((16, 1), (128, 2)):
        q, kv, table, seq = paged_case((2, 700, 4096, 333), heads=heads, s_q=s_q, d_lat=512, d_rope=64, page=64,
                                       dtype=torch.bfloat16, device="cuda")
        out, lse = mla_decode.mla_decode(q, kv, table, seq, 512, 192 ** -0.5)
        ref, ref_l = mla_decode.paged_reference(q, kv, table, seq, 512, 192 ** -0.5)
        assert float((out.double() - ref).abs().max()) < 2e-2 and float((lse.double() - ref_l).abs().max()) < 2e-2


def test_head_blocks_same_output_and_their_cost_measured():
    """One pass per block of rows gives the same attention at every block size; the measurement reports the reads
    per step, the bytes with and without re-reads and the intensity of one pass (times are not asserted)."""
    from common.kernels import mla_head_blocks
    g = torch.Generator().manual_seed(6)
    q, kv = torch.randn(20, 40, generator=g, dtype=torch.float64), torch.randn(33, 40, generator=g, dtype=torch.float64)
    ref, _ = mla.mqa_attention(q[None], kv, 32, 0.2, causal=False)
    for bh in (1, 3, 16, 20, 64):
        assert torch.allclose(mla_head_blocks.head_blocked_attention(q, kv, 32, 0.2, bh), ref[0], atol=1e-12)
    rows = mla_head_blocks.head_block_cost((1, 4, 16), rows=16, tokens=64, repeats=2, device="cpu")
    assert [r["block_h"] for r in rows] == [1, 4, 16] and [r["kv_reads"] for r in rows] == [16, 4, 1]
    assert rows[0]["bytes_with_rereads"] == 16 * 64 * 576 * 4 + 16 * 1088 * 4 and \
        rows[2]["bytes_with_rereads"] == rows[2]["bytes_kv_once"]
    assert len({r["flops"] for r in rows}) == 1 and all(r["seconds"] > 0 for r in rows)
    assert math.isclose(rows[1]["intensity_per_pass"], 4 * 2 * 1088 / (576 * 4))
    with pytest.raises(ValueError, match=r"repeats=1 must be an integer >= 2"):
        mla_head_blocks.head_block_cost(repeats=1)

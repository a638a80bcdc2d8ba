import json
import math
from dataclasses import replace

import pytest
import torch

from common.core import ceilings, traces
from common.systems import capstone


@pytest.fixture(autouse=True, scope="module")
def _triton_mode_first():
    """Set Triton's mode before torch.profiler imports triton (as a notebook's set-up cell does)."""
    from common.core.env import current
    current()


TINY = capstone.BlockConfig(batch=2, seq=12, hidden=16, heads=2, head_dim=8, q_rank=8, kv_rank=4, experts=8, top_k=2,
                            n_group=2, topk_group=1, expert_ffn=8)


def _versions():
    out, v = [capstone.BASELINE], capstone.BASELINE
    for name, change in capstone.CANDIDATES:
        v = capstone.apply(v, name, change)
        out.append(v)
    return out


def test_config_validation():
    with pytest.raises(ValueError, match="seq=0"):
        capstone.BlockConfig(seq=0)
    with pytest.raises(ValueError, match="top_k"):
        capstone.BlockConfig(experts=4, top_k=8, n_group=1, topk_group=1)
    with pytest.raises(ValueError, match="profile='auto'"):
        capstone.config_for("auto")
    with pytest.raises(ValueError, match="dtype='int8'"):
        capstone.BlockConfig(dtype="int8")
    quick = capstone.config_for("quick")
    assert (quick.experts, quick.top_k, quick.n_group, quick.topk_group) == (256, 8, 8, 4)  # V3's routing


def test_versions_and_candidates():
    vs = _versions()
    assert len(vs) == 1 + len(capstone.CANDIDATES) and vs[-1] == replace(capstone.all_applied(), name=vs[-1].name)
    final = vs[-1]
    assert (final.moe, final.attention, final.norm, final.log_loss) == ("grouped", "sdpa", "fused", False)
    assert [v.moe for v in vs[:3]] == ["loop", "sorted", "grouped"]
    with pytest.raises(ValueError, match="attention='flash'"):
        capstone.Version("x", attention="flash")
    with pytest.raises(ValueError, match="unknown fields"):
        capstone.apply(capstone.BASELINE, "x", {"compiled": True})


@pytest.mark.parametrize("version", _versions(), ids=lambda v: v.name)
def test_every_version_matches_the_baseline(version):
    block = capstone.Block(TINY, seed=3, dtype=torch.float64)
    x = capstone.make_input(TINY, seed=3, dtype=torch.float64)
    ref = capstone.outputs_and_grads(block, x, capstone.BASELINE)
    got = capstone.outputs_and_grads(block, x, version)
    assert capstone.equivalent(ref, got, rtol=1e-10), capstone.worst_relative_errors(ref, got)
    assert all(g is not None for g in got.values())


def _moe_case(t=20, h=6, f=5, e=4, k=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, dtype=torch.float64, generator=g)
    idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    w = torch.rand(t, k, dtype=torch.float64, generator=g)
    ws = [torch.randn(e, h, f, dtype=torch.float64, generator=g), torch.randn(e, h, f, dtype=torch.float64, generator=g),
          torch.randn(e, f, h, dtype=torch.float64, generator=g)]
    return x, w, idx, ws


def test_loop_and_grouped_moe_agree_with_a_dense_reference():
    x, w, idx, ws = _moe_case()
    dense = torch.stack([sum(w[i, j] * capstone.ffn(x[i:i + 1], *[a[int(idx[i, j])] for a in ws])[0]
                             for j in range(idx.shape[1])) for i in range(x.shape[0])])
    assert torch.allclose(capstone.moe_loop_forward(x, w, idx, *ws), dense)
    assert torch.allclose(capstone.moe_grouped_forward(x, w, idx, *ws), dense)
    assert torch.allclose(capstone.moe_sorted_forward(x, w, idx, *ws), dense)


def test_grouped_layer_is_three_batched_gemms_and_padding_is_counted():
    from torch.utils._python_dispatch import TorchDispatchMode
    calls = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    x, w, idx, ws = _moe_case(e=5)
    with Count():
        capstone.moe_grouped_forward(x, w, idx, *ws)
    assert calls.count("bmm") == 3 and "mm" not in calls
    plan = __import__("common.moe.moe", fromlist=["dispatch_plan"]).dispatch_plan(idx, 5)
    slot, cap = capstone.padded_slots(plan, 5)
    assert cap == int(plan.counts.max()) and len(set(slot.tolist())) == idx.numel()
    even = torch.arange(8).view(4, 2) % 4
    assert capstone.padding_waste(even, 4) == 0.0 and capstone.padding_waste(torch.zeros(4, 1, dtype=torch.long), 4) \
        == pytest.approx(0.75)


def test_router_bias_balances_the_experts():
    block = capstone.Block(capstone.QUICK)
    idx = block.routing(capstone.make_input(capstone.QUICK))
    assert capstone.padding_waste(idx, capstone.QUICK.experts) < 0.2  # the busiest expert within ~1.2x of the mean
    assert block.bias.shape == (capstone.QUICK.experts,) and not block.bias.requires_grad


def test_equivalent_rejects_real_differences():
    block = capstone.Block(TINY)
    x = capstone.make_input(TINY)
    ref = capstone.outputs_and_grads(block, x)
    bad = dict(ref)
    bad["grad.w_down"] = ref["grad.w_down"] * 1.01
    assert capstone.equivalent(ref, ref) and not capstone.equivalent(ref, bad)
    bad = dict(ref, out=ref["out"].clone())
    bad["out"][0, 0, 0] = float("nan")
    assert not capstone.equivalent(ref, bad)
    assert capstone.max_abs_error(ref, ref) == 0.0
    with pytest.raises(AssertionError, match="not equivalent"):
        capstone.verify(block, x, capstone.BASELINE, bad)


def test_host_sync_logs_only_when_asked():
    block = capstone.Block(TINY)
    x = capstone.make_input(TINY)
    capstone.step(block, x, capstone.apply(capstone.BASELINE, "q", {"log_loss": False}))
    assert block.log == []
    capstone.step(block, x, capstone.BASELINE)
    assert len(block.log) == 2


def test_flops_and_bytes():
    block = capstone.Block(TINY)
    x = capstone.make_input(TINY)
    flops, nbytes = capstone.step_flops_and_bytes(block, x, capstone.all_applied())
    t, d, a = TINY.tokens, TINY.hidden, TINY.attn_width
    assert flops > 3 * 2 * t * d * a and nbytes > 4 * t * d


# ---------------------------------------------------------------- costs: V3 and the block side by side
def test_v3_layer_costs_rank_routed_experts_first():
    v3 = capstone.v3_predicted_times()
    assert set(v3) == set(capstone.COMPONENTS)
    assert capstone.ranking(v3) == ["routed_experts", "attention_core", "mla_proj"]
    s = capstone.shares(v3)
    assert s["routed_experts"] == pytest.approx(0.51, abs=0.02) and s["gate"] < 0.01
    shape = capstone.v3_layer()
    assert (shape.hidden, shape.experts, shape.top_k, shape.kv_rank, shape.qk_dim) == (7168, 256, 8, 512, 192)


def test_kernel_costs_by_hand():
    shape = capstone.LayerShape("t", tokens=4, seq=4, hidden=8, heads=2, qk_dim=3, v_dim=3, q_rank=0, kv_rank=2,
                                rope_dim=0, experts=4, top_k=2, expert_ffn=5, shared=1, gemm_dtype="fp32",
                                attn_dtype="fp32", act_dtype="fp32")
    ks = {(k.part, k.what): k for k in capstone.kernels(shape)}
    assert ks[("mla_proj", "W_q")].flops == 3 * 2 * 4 * 8 * 6
    assert ks[("routed_experts", "down projection")].flops == 3 * 2 * (4 * 2) * 5 * 8
    assert ks[("attention_core", "causal flash attention, forward + backward")].flops == 3.5 * 2 * 4 * 2 * 6 * 4 / 2
    times = capstone.predicted_times(shape, {"fp32": 1e9}, 1e9)
    assert times["norm"] == pytest.approx(2 * 5 * 4 * 8 * 4 / 1e9)
    with pytest.raises(ValueError, match="no peak given for dtype 'fp32'"):
        capstone.predicted_times(shape, {"bf16": 1e9}, 1e9)
    mla, mha = capstone.mla_vs_mha_kv_flops(capstone.QUICK)
    assert mha / mla > 2


# ---------------------------------------------------------------- profiling, overhead, Amdahl
def test_amdahl_and_corrected_share():
    assert capstone.amdahl(0.5) == pytest.approx(2.0) and capstone.amdahl(0.5, 2.0) == pytest.approx(4 / 3)
    assert math.isinf(capstone.amdahl(1.0))
    with pytest.raises(ValueError, match="share=1.5"):
        capstone.amdahl(1.5)
    # profiled 100 ms with 1000 ops against 60 ms unprofiled: 40 us per op; the part: 70 ms, 900 ops -> 34 / 60
    assert capstone.overhead_per_op(0.1, 0.06, 1000) == pytest.approx(4e-5)
    assert capstone.corrected_share(70, 900, 100, 1000, 60) == pytest.approx(34 / 60)
    with pytest.raises(ValueError, match="ops >= 1"):
        capstone.overhead_per_op(0.1, 0.06, 0)


def test_profile_step_reads_components_and_writes_no_native_lines(tmp_path, capfd):
    block = capstone.Block(TINY)
    x = capstone.make_input(TINY)
    prof = capstone.profile_step(block, x, capstone.BASELINE, tmp_path / "t.json")
    out, err = capfd.readouterr()
    assert "USDT" not in err and "profiler_start" not in err  # captured at its source
    assert set(prof.times) == set(capstone.COMPONENTS) | {"other"}
    assert prof.times["routed_experts"]["ops"] > prof.times["gate"]["ops"] > 0
    shares = prof.shares()
    assert sum(shares.values()) == pytest.approx(1.0) and 0 <= prof.idle_share < 1
    assert prof.ops == sum(t["ops"] for t in prof.times.values())
    over = capstone.profiler_overhead(block, x, capstone.all_applied(), tmp_path / "u.json", rounds=2)
    assert len(over.unprofiled) == len(over.profiled) == len(over.profiles) == 2 and over.ratio > 0
    assert over.cold > 0 and over.profile in over.profiles and over.unprofiled_s > 0
    out, err = capfd.readouterr()
    assert "USDT" not in err
    assert sum(over.profile.with_gaps(k) for k in over.profile.times) == pytest.approx(over.profile.profiled_us)
    busy = capstone.busy_shares(over.profiles)
    assert sum(busy.values()) == pytest.approx(1.0) and max(busy, key=busy.get) in capstone.COMPONENTS


def test_busy_shares_take_each_parts_least_time():
    class P:
        def __init__(self, **us):
            self.times = {k: {"us": v, "ops": 1} for k, v in us.items()}
    shares = capstone.busy_shares([P(a=10, b=50), P(a=30, b=10)], ("a", "b"))  # a preemption in each profile
    assert shares == pytest.approx({"a": 0.5, "b": 0.5})


# ---------------------------------------------------------------- the guard
def test_keep_or_revert_on_timed_steps():
    import random
    import time
    slow = lambda: time.sleep(0.004)  # noqa: E731
    fast = lambda: time.sleep(0.001)  # noqa: E731
    v = capstone.judge("fast", slow, fast, pairs=5, max_pairs=15, rng=random.Random(0))  # timed sleeps, 4x apart
    assert v.decision != "revert" and v.ratio > 1.5 and v.pairs in (5, 10, 15)  # a stall can widen the interval
    assert ("KEPT" if v.kept else "undecided") in v.summary()
    with pytest.raises(ValueError, match="pairs=2"):
        capstone.keep_or_revert(slow, fast, pairs=2)


def test_keep_or_revert_on_a_fake_clock():
    """The workbook's guard against the exercise's device: the same ratios and calls as the checker expects."""
    from common.exercises import guard_checks
    for name, bar, pairs, max_pairs, ratios in guard_checks.CASES:
        dev = guard_checks.Device(*guard_checks.series(0.01, ratios[:max_pairs]))
        import random
        decision, got = capstone.keep_or_revert(dev.step("current"), dev.step("candidate"), bar, pairs, max_pairs,
                                                random.Random(1), dev.clock, dev.sync)
        assert dev.unsynced_reads == 0 and decision == (capstone.decide(got, bar) or "undecided"), name
        assert got == pytest.approx(ratios[:len(got)], rel=1e-3)


def test_try_change_verifies_before_timing():
    import random
    block = capstone.Block(TINY)
    x = capstone.make_input(TINY)
    ref = capstone.outputs_and_grads(block, x)
    v = capstone.try_change(block, x, capstone.BASELINE, *capstone.CANDIDATES[0], ref, pairs=5, max_pairs=5,
                            rng=random.Random(0))
    assert v.version.moe == "sorted" and v.worst_rel_err < 1e-4 and v.pairs == 5
    wrong = lambda x, w, i, *ws: capstone.moe_grouped_forward(x, w * 1.1, i, *ws)  # noqa: E731
    with pytest.raises(AssertionError, match="not equivalent"):
        capstone.try_change(block, x, capstone.BASELINE, *capstone.CANDIDATES[1], ref, layers={"grouped": wrong})
    seen = []
    mine = lambda current, candidate, **kw: (seen.append(kw), ("revert", [1.0] * 5))[1]  # noqa: E731
    v = capstone.try_change(block, x, capstone.BASELINE, *capstone.CANDIDATES[2], ref, guard=mine, bar=0.05)
    assert v.decision == "revert" and seen == [{"bar": 0.05}] and v.bar == 0.05


def test_waterfall_greys_reverted_changes():
    import matplotlib
    matplotlib.use("Agg")
    kept = capstone.Verdict("a", [2.0] * 5, "keep")
    reverted = capstone.Verdict("b", [1.01] * 5, "undecided")
    fig = capstone.plot_waterfall(100.0, [kept, reverted])
    bars = fig.axes[0].patches
    assert len(bars) == 3 and bars[2].get_hatch() == "//" and bars[1].get_hatch() is None
    with pytest.raises(ValueError, match="decision='kept'"):
        capstone.Verdict("c", [1.0] * 5, "kept")


def test_kept_version_round_trips_to_the_command(tmp_path, capsys, monkeypatch):
    from common.systems.capstone import __main__ as command
    monkeypatch.setattr(command, "config_for", lambda profile: TINY)
    main = command.main
    v = capstone.apply(capstone.BASELINE, "x", {"moe": "grouped", "attention": "sdpa"})
    path = tmp_path / "kept.json"
    path.write_text(json.dumps(capstone.as_dict(v)))
    assert capstone.from_dict(capstone.as_dict(v)) == v
    main(["--version", "kept", "--kept", str(path), "--steps", "1", "--profile", "quick"])
    assert "moe='grouped'" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no fields"):
        capstone.from_dict({"name": "x", "compiled": True})


def test_matmul_ceiling_is_taken_in_the_blocks_dtype(monkeypatch):
    from types import SimpleNamespace
    timing = SimpleNamespace()
    own = ceilings.Ceiling("matmul rate", 100.0, "GFLOP/s", "cpu, float32", timing)
    monkeypatch.setattr(ceilings, "machine_profile", lambda: SimpleNamespace(matmul=own, matmul_n=64, threads=1))
    monkeypatch.setattr(ceilings, "_dtype_ceilings", {})
    assert ceilings.matmul_ceiling(torch.float32, "cpu") is own  # the profile's own dtype on a CPU
    measured = []

    def fake(n, dtype=None, device=None, **kw):
        measured.append((n, dtype))
        return ceilings.Ceiling("matmul rate", 1.0, "GFLOP/s", f"{dtype}", timing)
    monkeypatch.setattr(ceilings, "measure_matmul_rate", fake)
    assert ceilings.matmul_ceiling(torch.float64, "cpu").detail == "torch.float64"
    ceilings.matmul_ceiling(torch.float64, "cpu")
    assert measured == [(64, torch.float64)]  # measured once, at the profile's size, then kept
    assert ceilings.matmul_ceiling(torch.float32, "cuda").detail == "torch.float32"  # a GPU's profile is bf16


# ---------------------------------------------------------------- traces
def _ev(ts, dur, name="aten::op", cat="cpu_op", tid=1, seq=None):
    e = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid}
    if seq is not None:
        e["args"] = {"Sequence number": seq}
    return e


def test_idle_share_merges_clips_and_counts_edges():
    events = [_ev(0, 60), _ev(10, 30), _ev(80, 40), _ev(-20, 25)]
    assert traces.merged_intervals(events, (0, 100)) == [(0, 60), (80, 100)]
    assert traces.idle_share(events, (0, 100)) == pytest.approx(0.2)
    assert traces.idle_share([], (0, 10)) == 1.0
    with pytest.raises(ValueError, match="window"):
        traces.idle_share(events, (5, 5))


def test_top_level_drops_nested():
    events = [_ev(0, 50), _ev(5, 10), _ev(60, 5), _ev(0, 20, tid=2)]
    assert [(e["ts"], e["tid"]) for e in traces.top_level(events)] == [(0, 1), (0, 2), (60, 1)]


def test_component_shares_and_times_charge_backward_to_forward(tmp_path):
    events = [_ev(0, 100, "step", "user_annotation"), _ev(0, 30, "attention", "user_annotation"),
              _ev(1, 20, "aten::mm", seq=7), _ev(2, 5, "aten::copy_"), _ev(30, 20, "moe", "user_annotation"),
              _ev(31, 15, "aten::mm", seq=8),
              _ev(60, 10, "autograd::engine::evaluate_function: MmBackward0", seq=8), _ev(61, 4, "aten::mm"),
              _ev(70, 20, "autograd::engine::evaluate_function: MmBackward0", seq=7), _ev(95, 5, "aten::item")]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    loaded = traces.load_trace(path)
    window = traces.find_window(loaded, "step")
    shares = traces.component_shares(loaded, window, ("attention", "moe"))
    assert shares["attention"] == pytest.approx(0.40) and shares["moe"] == pytest.approx(0.25)
    assert shares["other"] == pytest.approx(0.05) and shares["idle"] == pytest.approx(0.30)
    assert sum(shares.values()) == pytest.approx(1.0)
    times = traces.component_times(loaded, window, ("attention", "moe"))
    assert times["attention"] == {"us": 40.0, "ops": 3} and times["moe"] == {"us": 25.0, "ops": 3}
    assert times["other"] == {"us": 5.0, "ops": 1}
    with pytest.raises(ValueError, match="no event named"):
        traces.find_window(loaded, "nope")


def test_lab12_cells_write_nothing_to_stderr():
    """The profiler's native `USDT ... profiler_start/stop` lines (and any warning) never reach a cell's output."""
    import nbformat

    from common.core import notebooks
    nb = nbformat.read(str(notebooks.SOLUTIONS / "12_profiling_loop.ipynb"), as_version=4)
    noisy = [(i, "".join(o.get("text", ""))[:80]) for i, c in enumerate(nb.cells) if c.cell_type == "code"
             for o in c.outputs if o.output_type == "stream" and o.name == "stderr"]
    assert not noisy, f"cells print to stderr: {noisy}"

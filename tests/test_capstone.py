import json
from dataclasses import replace

import pytest
import torch

from common.core import traces
from common.systems import capstone

TINY = capstone.BlockConfig(batch=2, seq=12, hidden=16, heads=2, head_dim=8, kv_rank=8, experts=4, top_k=2,
                            n_group=2, topk_group=1, expert_ffn=8)


def test_config_validation():
    with pytest.raises(ValueError, match="seq=0"):
        capstone.BlockConfig(seq=0)
    with pytest.raises(ValueError, match="top_k"):
        capstone.BlockConfig(experts=4, top_k=8, n_group=1, topk_group=1)
    with pytest.raises(ValueError, match="profile='auto'"):
        capstone.config_for("auto")
    assert capstone.config_for("quick").tokens == 256


def test_versions_are_cumulative():
    vs = capstone.VERSIONS
    assert vs[0] == capstone.BASELINE and len(vs) == 6
    final = vs[-1]
    assert (final.moe, final.attention, final.compiled, final.host_sync, final.preallocated) == \
        ("grouped", "sdpa", True, False, True)
    with pytest.raises(ValueError, match="compiled=True needs"):
        capstone.Version("x", compiled=True)
    with pytest.raises(ValueError, match="attention='flash'"):
        capstone.Version("x", attention="flash")


@pytest.mark.parametrize("version", [v for v in capstone.VERSIONS if not v.compiled] +
                         [replace(capstone.VERSIONS[-1], compiled=False)], ids=lambda v: v.name)
def test_every_version_matches_the_baseline(version):
    block = capstone.Block(TINY, seed=3, dtype=torch.float64)
    x = capstone.make_input(TINY, seed=3, dtype=torch.float64)
    ref = capstone.outputs_and_grads(block, x, capstone.BASELINE)
    got = capstone.outputs_and_grads(block, x, version)
    assert capstone.equivalent(ref, got, rtol=1e-10), capstone.worst_relative_errors(ref, got)
    assert all(g is not None for g in got.values())


def test_loop_and_grouped_moe_agree_with_dense_reference():
    torch.manual_seed(0)
    t, h, f, e, k = 10, 6, 5, 3, 2
    x = torch.randn(t, h, dtype=torch.float64)
    idx = torch.stack([torch.randperm(e)[:k] for _ in range(t)])
    w = torch.rand(t, k, dtype=torch.float64)
    ws = [torch.randn(e + 1, h, f, dtype=torch.float64), torch.randn(e + 1, h, f, dtype=torch.float64),
          torch.randn(e + 1, f, h, dtype=torch.float64)]
    dense = torch.stack([capstone.expert_ffn(x[i:i + 1], e, *[a.unbind(0) for a in ws])[0] +
                         sum(w[i, j] * capstone.expert_ffn(x[i:i + 1], int(idx[i, j]), *[a.unbind(0) for a in ws])[0]
                             for j in range(k)) for i in range(t)])
    assert torch.allclose(capstone.moe_loop_forward(x, w, idx, *ws), dense)
    assert torch.allclose(capstone.moe_grouped_forward(x, w, idx, *ws), dense)


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


def test_preallocated_state_is_reused():
    block = capstone.Block(TINY)
    v = capstone.VERSIONS[-1]
    assert block.mask(v) is block.mask(v) and block.probe(v) is block.probe(v)
    assert block.mask(capstone.BASELINE) is not block.mask(capstone.BASELINE)
    assert torch.equal(block.mask(v), capstone.causal_mask(TINY.seq))


def test_host_sync_logs_only_when_asked():
    block = capstone.Block(TINY)
    x = capstone.make_input(TINY)
    capstone.step(block, x, replace(capstone.VERSIONS[2], host_sync=False))
    assert block.log == []
    capstone.step(block, x, capstone.VERSIONS[2])
    assert len(block.log) == 2


def test_flops_and_bytes():
    block = capstone.Block(TINY)
    x = capstone.make_input(TINY)
    flops, nbytes = capstone.step_flops_and_bytes(block, x, capstone.VERSIONS[-1])
    t, d, a = TINY.tokens, TINY.hidden, TINY.heads * TINY.head_dim
    q_proj = 2 * t * d * a
    assert flops > 3 * q_proj and nbytes > 4 * t * d


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


def test_component_shares_charge_backward_to_forward(tmp_path):
    events = [_ev(0, 100, "step", "user_annotation"), _ev(0, 30, "attention", "user_annotation"),
              _ev(1, 20, "aten::mm", seq=7), _ev(30, 20, "moe", "user_annotation"), _ev(31, 15, "aten::mm", seq=8),
              _ev(60, 10, "autograd::engine::evaluate_function: MmBackward0", seq=8),
              _ev(70, 20, "autograd::engine::evaluate_function: MmBackward0", seq=7), _ev(95, 5, "aten::item")]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    loaded = traces.load_trace(path)
    window = traces.find_window(loaded, "step")
    shares = traces.component_shares(loaded, window, ("attention", "moe"))
    assert shares["attention"] == pytest.approx(0.40) and shares["moe"] == pytest.approx(0.25)
    assert shares["other"] == pytest.approx(0.05) and shares["idle"] == pytest.approx(0.30)
    assert sum(shares.values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no event named"):
        traces.find_window(loaded, "nope")


def test_profiled_step_has_components():
    from torch.profiler import ProfilerActivity, profile, record_function
    block = capstone.Block(TINY)
    x = capstone.make_input(TINY)
    v = capstone.VERSIONS[2]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("step"):
            capstone.step(block, x, v)
    events = [{"name": e.name, "cat": "cpu_op", "ts": e.time_range.start, "dur": e.time_range.elapsed_us(),
               "tid": e.thread} for e in prof.events()]
    assert events and 0.0 <= traces.idle_share(events, (min(e["ts"] for e in events),
                                                        max(e["ts"] + e["dur"] for e in events))) < 1.0

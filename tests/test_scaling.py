"""common/systems/cluster/scaling.py: 6ND, GPU-hours, implied MFU, cost, energy, memory per parameter, and its input checks."""
import math

import pytest

from common.systems.cluster import scaling


def test_six_n_d_and_its_inverse():
    assert scaling.train_flops(37e9, 14.8e12) == pytest.approx(3.2856e24)
    assert scaling.train_flops(100e12, 29e12) == pytest.approx(1.74e28)
    assert scaling.tokens_for_flops(1.2e29, 100e12) == pytest.approx(2e14)
    assert scaling.train_flops(1, 1, flops_per_param_token=8) == 8


def test_deepseek_v3_cost_and_mfu_from_claims():
    hours = scaling.claim("deepseek_v3", "gpu_hours_total")
    assert hours == 2788e3
    assert scaling.cost_usd(hours, scaling.claim("deepseek_v3", "usd_per_gpu_hour")) == pytest.approx(5.576e6)
    flops = scaling.train_flops(37e9, scaling.claim("deepseek_v3", "train_tokens"))
    bf16 = scaling.implied_mfu(flops, hours, scaling.peak_tflops("H800-SXM", "bf16"))
    fp8 = scaling.implied_mfu(flops, hours, scaling.peak_tflops("H800-SXM", "fp8"))
    assert 0.30 < bf16 < 0.36 and fp8 == pytest.approx(bf16 / 2, rel=1e-3)


def test_r1_cost_adds_up_at_two_dollars():
    c = lambda k: scaling.claim("deepseek_r1", k)  # noqa: E731
    hours = c("rl_gpus") * (c("r1_zero_hours") + c("r1_hours")) + c("sft_data_gpu_hours")
    assert scaling.cost_usd(hours, c("usd_per_gpu_hour")) == pytest.approx(c("total_cost_usd"), rel=0.01)


def test_gpu_hours_round_trip_with_mfu():
    flops = 1e24
    h = scaling.gpu_hours(flops, "H100-SXM", 0.5, "bf16")
    assert scaling.implied_mfu(flops, h, scaling.peak_tflops("H100-SXM", "bf16")) == pytest.approx(0.5)
    assert scaling.wall_days(h, 1000) == pytest.approx(h / 1000 / 24)


def test_memory_per_parameter():
    parts = scaling.adam_state_bytes(100e12)
    assert parts["total"] == pytest.approx(1600e12)
    assert scaling.weight_bytes(100e12, "bf16") == 200e12
    assert scaling.state_bytes(1, "adam_mixed") == 16
    assert scaling.gpus_to_hold(80e9, "H100-SXM") == 1
    assert scaling.gpus_to_hold(80e9 + 1, "H100-SXM") == 2
    assert scaling.racks_to_hold(1600e12) == math.ceil(math.ceil(1600e12 / 186e9) / 72)


def test_energy_and_plan():
    assert scaling.energy_mwh(1000, 1000) == pytest.approx(1.0)
    plan = scaling.plan_training(100e12, 29e12, gpu_id="GB200", gpus=100_000, mfu=0.4)
    assert plan.flops == pytest.approx(1.74e28)
    assert plan.days == pytest.approx(plan.gpu_hours / 100_000 / 24)
    assert plan.state_tb == pytest.approx(1600)
    assert len(plan.rows()) == 8
    moe = scaling.plan_training(100e12, 29e12, active_fraction=0.05)
    assert moe.flops == pytest.approx(plan.flops * 0.05)


@pytest.mark.parametrize("call, match", [
    (lambda: scaling.train_flops(-1, 10), r"params=-1"),
    (lambda: scaling.train_flops(10, 0), r"tokens=0"),
    (lambda: scaling.gpu_hours(1e20, "H100-SXM", 0), r"mfu=0 is outside \(0, 1\]"),
    (lambda: scaling.gpu_hours(1e20, "H100-SXM", 40), r"did you mean 0.4"),
    (lambda: scaling.gpu_hours(1e20, "H100-SXM", 1.5), r"mfu=1.5"),
    (lambda: scaling.gpu_hours(1e20, "TPU-v5", 0.4), r"gpu_id='TPU-v5' is not a GPU in data/; allowed: .*H800-SXM"),
    (lambda: scaling.peak_tflops("H100-SXM", "fp4"), r"fp4"),
    (lambda: scaling.energy_mwh(10, 700, pue=0.5), r"pue=0.5"),
    (lambda: scaling.state_bytes(1, "lion"), r"recipe='lion'.*adam_mixed"),
    (lambda: scaling.weight_bytes(1, "int3"), r"precision='int3'"),
    (lambda: scaling.gpus_to_hold(1e12, "H100-SXM", usable_fraction=2), r"usable_fraction=2"),
    (lambda: scaling.claim("deepseek_v3", "nope"), r"'nope'.*allowed"),
    (lambda: scaling.train_flops("many", 1), r"params='many' must be a finite number > 0"),
])
def test_bad_input_names_value_and_allowed(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_every_claim_has_a_source():
    data = scaling.load_claims()
    for group, entries in data["claims"].items():
        for name, entry in entries.items():
            assert entry["source"] in data["sources"], f"{group}.{name}"
            assert "http" in scaling.claim_source(group, name)
    for src in data["sources"].values():
        assert src["title"] and src["url"].startswith("http") and src["date"]


# ---- lab 10's planning widget with the values a browser sends (issue 18)
SNAPPED = dict(params_t=99.99999999999999, tokens_t=28.999999999999996, active_pct=100.00000000000001,
               precision="bf16", gpu="GB200", gpus=100000.00000000001, mfu=0.39999999999999997,
               usd_per_gpu_hour=2.0000000000000004)


def test_snap_controls_puts_browser_values_back_on_the_grid():
    v = scaling.snap_controls(SNAPPED)
    assert v == {**scaling.PLAN_DEFAULTS, "params_t": 100.0, "tokens_t": 29.0}
    assert isinstance(v["gpus"], int) and v["mfu"] == 0.4 and v["active_pct"] == 100.0
    assert scaling.snap_controls({"mfu": 0.15000000000000002})["mfu"] == 0.15
    with pytest.raises(ValueError, match="active_pct=150"):
        scaling.snap_controls({"active_pct": 150})
    with pytest.raises(ValueError, match="precision='fp2'"):
        scaling.snap_controls({"precision": "fp2"})
    with pytest.raises(ValueError, match="not a control"):
        scaling.snap_controls({"nodes": 3})


def _notebook_callback():
    import nbformat

    from common.core.env import REPO_ROOT
    nb = nbformat.read(REPO_ROOT / "solutions" / "10_scaling_and_cost.ipynb", 4)
    src = next(c.source for c in nb.cells if c.source.startswith("def show_plan("))
    return src.split("\n\n\nexplore(")[0]


def test_lab10_widget_callback_draws_with_snapped_values(capsys):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    shown = []

    def display(fig):  # what the notebook's display does, headless: draw the figure completely
        fig.canvas.draw()
        shown.append(fig)

    ns = {"scaling": scaling, "pd": pd, "plt": plt, "display": display}
    exec(_notebook_callback(), ns)  # noqa: S102 -- the notebook's own callback
    for values in (SNAPPED, {**SNAPPED, "precision": "fp8", "gpu": "H800-SXM", "active_pct": 5.000000000000001,
                             "params_t": 0.9999999999999999 + 0.0}):
        ns["show_plan"](**values)
    out = capsys.readouterr().out
    assert "Not possible" not in out and len(shown) == 2
    assert "1.74e28" in out  # 6 x 100T x 29T: the snapped values gave the plan of the text
    # no tight_layout: the figure keeps its fixed margins
    assert shown[0].get_layout_engine() is None and shown[0].subplotpars.left == pytest.approx(0.11)
    ns["show_plan"](**{**SNAPPED, "precision": "fp4", "gpu": "H100-SXM"})
    assert "Not possible" in capsys.readouterr().out  # asked of the plan, said in words, not a traceback

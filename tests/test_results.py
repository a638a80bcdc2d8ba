"""The results ledger and the rule that judges a run against this machine's baseline (common.core.baseline)."""
import json

import pytest

from common.core import baseline as bl
from common.core import results


def test_record_writes_a_ledger_line(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    monkeypatch.setenv("WORKBOOK_RESULTS", str(path))
    rec = results.record("machine.copy_gbps", 12.5, "GB/s", higher_is_better=True)
    line = json.loads(path.read_text().splitlines()[-1])
    for key in ("name", "value", "unit", "lab", "device", "profile"):
        assert key in line
    assert line == rec and line["value"] == 12.5
    assert "machine.copy_gbps" in results.summary().index


@pytest.mark.parametrize("bad", ["Machine.copy", "copy", "machine..x", "machine copy", ""])
def test_bad_names(bad):
    with pytest.raises(ValueError, match="is not a dotted path"):
        results.record(bad, 1.0, "x")


def test_hardware_ids_keep_their_case():
    results.validate_name("roofline.ridge.H100-SXM.bf16")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "fast"])
def test_bad_values(value):
    with pytest.raises(ValueError, match="result a.b"):
        results.record("a.b", value, "x")


def test_measured_flag_without_direction():
    rec = results.record("m.shift", 0.2, "fraction", measured=True)
    assert rec["measured"] and "higher_is_better" not in rec
    assert results.record("m.flops", 2.0, "x")["measured"] is False
    assert results.record("m.gbps", 2.0, "GB/s", higher_is_better=True)["measured"] is True


def _status(records, base, moments=None, ref=None):
    return {r["name"]: r["status"] for r in bl.judge(records, base, moments, ref)}


def test_statuses_by_direction_and_kind():
    base = {"a.fast": {"value": 100.0, "tolerance": 0.1, "higher_is_better": True, "unit": "GB/s"},
            "a.slow": {"value": 100.0, "tolerance": 0.1, "higher_is_better": False, "unit": "ms"},
            "a.exact": {"value": 3.0, "tolerance": 1e-6},
            "a.ratio": {"value": 2.0, "tolerance": 0.2, "measured": True, "unit": "x"},
            "a.better": {"value": 1.0, "tolerance": 0.2, "higher_is_better": True, "unit": "x"}}
    recs = [{"name": "a.fast", "value": 70.0, "unit": "GB/s"}, {"name": "a.slow", "value": 95.0, "unit": "ms"},
            {"name": "a.exact", "value": 3.5, "unit": "x"}, {"name": "a.new", "value": 1.0, "unit": "x"},
            {"name": "a.ratio", "value": 3.0, "unit": "x"}, {"name": "a.better", "value": 2.0, "unit": "x"},
            {"name": "ledger.machine_drift", "value": -0.5, "unit": "fraction"}]
    assert _status(recs, base) == {"a.fast": "regression?", "a.slow": "ok", "a.exact": "changed", "a.new": "new",
                                   "a.ratio": "moved", "a.better": "improved"}


def test_bands_come_from_the_baseline_runs_own_spread():
    run = lambda v: {"records": [{"name": "a.t", "value": v, "unit": "ms", "measured": True,
                                  "higher_is_better": False, "lab": "x", "device": "cpu"}]}
    one = bl.make([run(10.0)], "cpu")["results"]["a.t"]
    assert one["tolerance"] == bl.DEFAULT_BAND and one["runs"] == 1
    quiet = bl.make([run(10.0), run(10.1), run(9.9)], "cpu")["results"]["a.t"]
    assert quiet["tolerance"] == bl.MIN_BAND and quiet["value"] == 10.0  # three close runs: the floor
    noisy = bl.make([run(10.0), run(14.0), run(7.0)], "cpu")["results"]["a.t"]
    assert noisy["tolerance"] > 1.0  # its own spread: a 1.5x slower run is within it
    assert _status([{"name": "a.t", "value": 15.0, "unit": "ms"}], {"a.t": noisy}) == {"a.t": "ok"}
    assert _status([{"name": "a.t", "value": 15.0, "unit": "ms"}], {"a.t": quiet}) == {"a.t": "regression?"}


def _moment(speed, others=0.0):
    return {"probes": [{"copy_gbps": 30 * speed, "matmul_gflops": 150 * speed}] * 2, "others": others}


REF = {"copy_gbps": 30.0, "matmul_gflops": 150.0, "band": 0.2}


def test_a_drifted_or_busy_machine_is_not_judged():
    base = {"a.t": {"value": 10.0, "tolerance": 0.35, "higher_is_better": False, "unit": "ms", "measured": True}}
    slow = [{"name": "a.t", "value": 20.0, "unit": "ms", "lab": "x"}]
    assert _status(slow, base, {"x": _moment(1.0)}, REF) == {"a.t": "regression?"}
    assert _status(slow, base, {"x": _moment(0.6)}, REF) == {"a.t": "machine drifted"}
    assert _status(slow, base, {"x": _moment(1.0, others=0.9)}, REF) == {"a.t": "machine drifted"}
    row = bl.judge(slow, base, {"x": _moment(0.6)}, REF)[0]
    assert row["machine"]["drift"] == pytest.approx(-0.4) and bl.describe(row["machine"]) == "-40%, others 0.00 cores"


def test_a_speed_is_judged_against_the_probe_at_the_same_moment():
    """Within the probe's band, a speed whose ratio to the probe held is ok; a ratio (fraction) is not rescued."""
    base = {"a.gbps": {"value": 10.0, "tolerance": 0.2, "higher_is_better": True, "unit": "GB/s", "measured": True,
                       "per_probe": {"value": 10.0, "tolerance": 0.2}},
            "a.frac": {"value": 1.0, "tolerance": 0.2, "higher_is_better": True, "unit": "fraction"}}
    recs = [{"name": "a.gbps", "value": 7.6, "unit": "GB/s", "lab": "x"},
            {"name": "a.frac", "value": 0.76, "unit": "fraction", "lab": "x"}]
    assert _status(recs, base, {"x": _moment(0.85)}, REF) == {"a.gbps": "ok", "a.frac": "regression?"}
    assert bl.judge(recs, base, {"x": _moment(0.85)}, REF)[0]["per_probe"] == pytest.approx(7.6 / 0.85 / 10)


def test_confirm_needs_the_rerun_to_be_a_candidate_too():
    base = {"a.t": {"value": 10.0, "tolerance": 0.35, "higher_is_better": False, "unit": "ms", "measured": True}}
    first = bl.judge([{"name": "a.t", "value": 30.0, "unit": "ms", "lab": "x"}], base)
    for again, status in ((30.0, "regression"), (10.5, "not confirmed")):
        rows = bl.confirm(first, bl.judge([{"name": "a.t", "value": again, "unit": "ms", "lab": "x"}], base))
        assert rows[0]["status"] == status and rows[0]["rerun"] == again
    drifted = bl.judge([{"name": "a.t", "value": 30.0, "unit": "ms", "lab": "x"}], base, {"x": _moment(0.5)}, REF)
    assert bl.confirm(first, drifted)[0]["status"] == "not confirmed"


def test_zero_baselines_do_not_divide_by_zero():
    base = {"a.err": {"value": 0.0, "tolerance": 0.35, "higher_is_better": False, "unit": "abs", "measured": True}}
    assert _status([{"name": "a.err", "value": 0.0, "unit": "abs"}], base) == {"a.err": "ok"}
    assert _status([{"name": "a.err", "value": 1e-7, "unit": "abs"}], base) == {"a.err": "moved"}


def test_measured_results_compare_only_with_this_machines_baseline(tmp_path):
    """The committed reference's measured entries never judge another machine; its deterministic ones always do."""
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "cpu.json").write_text(json.dumps({"results": {
        "a.speed": {"value": 100.0, "tolerance": 0.1, "measured": True, "higher_is_better": True},
        "a.formula": {"value": 3.0, "tolerance": 1e-4, "measured": False}}}))
    recs = [{"name": "a.speed", "value": 10.0, "unit": "GB/s"}, {"name": "a.formula", "value": 4.0, "unit": "x"}]
    assert _status(recs, results.baselines_for("cpu", {}, ref)) == {"a.speed": "new", "a.formula": "changed"}
    own = {"a.speed": {"value": 20.0, "tolerance": 0.1, "measured": True, "higher_is_better": True}}
    assert _status(recs, results.baselines_for("cpu", own, ref))["a.speed"] == "regression?"


def test_deterministic_only_reference():
    recs = [{"name": "a.t", "value": 1.0, "unit": "s", "measured": True, "higher_is_better": False},
            {"name": "a.f", "value": 2.0, "unit": "x", "measured": False}]
    made = bl.make([{"records": recs}], "cpu", deterministic_only=True)["results"]
    assert list(made) == ["a.f"] and made["a.f"]["tolerance"] == bl.DETERMINISTIC_TOLERANCE

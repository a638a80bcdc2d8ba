import json

import pytest

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


def test_compare_with_baseline_directions():
    base = {"a.fast": {"value": 100.0, "tolerance": 0.1, "higher_is_better": True},
            "a.slow": {"value": 100.0, "tolerance": 0.1, "higher_is_better": False},
            "a.exact": {"value": 3.0, "tolerance": 1e-6}}
    base["a.ratio"] = {"value": 2.0, "tolerance": 0.2, "measured": True}
    recs = [{"name": "a.fast", "value": 70.0}, {"name": "a.slow", "value": 95.0},
            {"name": "a.exact", "value": 3.5}, {"name": "a.new", "value": 1.0}, {"name": "a.ratio", "value": 3.0}]
    status = {r["name"]: r["status"] for r in results.compare_with_baseline(recs, base)}
    assert status == {"a.fast": "regression", "a.slow": "ok", "a.exact": "changed", "a.new": "new",
                      "a.ratio": "drift"}


def test_measured_flag_without_direction():
    rec = results.record("m.shift", 0.2, "fraction", measured=True)
    assert rec["measured"] and "higher_is_better" not in rec
    assert results.record("m.flops", 2.0, "x")["measured"] is False
    assert results.record("m.gbps", 2.0, "GB/s", higher_is_better=True)["measured"] is True


def test_planted_slowdown_is_flagged_noise_is_not():
    base = {"x.gbps": {"value": 100.0, "tolerance": 0.15, "higher_is_better": True}}
    assert results.compare_with_baseline([{"name": "x.gbps", "value": 80.0}], base)[0]["status"] == "regression"
    assert results.compare_with_baseline([{"name": "x.gbps", "value": 93.0}], base)[0]["status"] == "ok"


def test_make_baseline_roundtrip():
    recs = [{"name": "m.x", "value": 2.0, "unit": "s", "higher_is_better": False, "measured": True},
            {"name": "m.y", "value": 3.0, "unit": "B", "measured": False}]
    b = results.make_baseline(recs, "cpu", 0.3)
    assert b["results"]["m.x"]["tolerance"] == 0.3 and b["results"]["m.y"]["tolerance"] == results.DETERMINISTIC_TOLERANCE
    assert all(r["status"] == "ok" for r in results.compare_with_baseline(recs, b["results"]))


def test_measured_results_compare_only_with_this_machines_baseline(tmp_path):
    """The committed reference's measured entries never judge another machine; its deterministic ones always do."""
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "cpu.json").write_text(json.dumps({"results": {
        "a.speed": {"value": 100.0, "tolerance": 0.1, "measured": True, "higher_is_better": True},
        "a.formula": {"value": 3.0, "tolerance": 1e-4, "measured": False}}}))
    recs = [{"name": "a.speed", "value": 10.0}, {"name": "a.formula", "value": 4.0}]
    fresh = {r["name"]: r["status"] for r in results.compare_with_baseline(recs, results.baselines_for("cpu", {}, ref))}
    assert fresh == {"a.speed": "new", "a.formula": "changed"}
    own = {"a.speed": {"value": 20.0, "tolerance": 0.1, "measured": True, "higher_is_better": True}}
    mine = {r["name"]: r["status"] for r in results.compare_with_baseline(recs, results.baselines_for("cpu", own, ref))}
    assert mine["a.speed"] == "regression"


def test_deterministic_only_reference():
    recs = [{"name": "a.t", "value": 1.0, "unit": "s", "measured": True, "higher_is_better": False},
            {"name": "a.f", "value": 2.0, "unit": "x", "measured": False}]
    assert list(results.make_baseline(recs, "cpu", 0.5, deterministic_only=True)["results"]) == ["a.f"]

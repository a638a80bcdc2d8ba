"""Reading a GPU trace (common.core.traces): checked loading, launch-to-phase attribution, streams, overlap."""
import json

import pytest

from common.core import traces
from tests import synthetic_trace as st


@pytest.fixture
def events(tmp_path):
    return traces.complete_events(traces.read_trace(st.write(tmp_path / "t.json")))


def test_read_trace_errors_name_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        traces.read_trace(tmp_path / "missing.json")
    (tmp_path / "empty.json").write_text("  ")
    with pytest.raises(ValueError, match="is empty"):
        traces.read_trace(tmp_path / "empty.json")
    (tmp_path / "text.json").write_text("this is not a trace")
    with pytest.raises(ValueError, match="is not JSON"):
        traces.read_trace(tmp_path / "text.json")
    full = json.dumps(st.trace())
    (tmp_path / "cut.json").write_text(full[: len(full) // 2])
    with pytest.raises(ValueError, match="is truncated"):
        traces.read_trace(tmp_path / "cut.json")
    (tmp_path / "noevents.json").write_text(json.dumps({"schemaVersion": 1, "events": []}))
    with pytest.raises(ValueError, match="no 'traceEvents' list.*events, schemaVersion"):
        traces.read_trace(tmp_path / "noevents.json")
    (tmp_path / "list.json").write_text(json.dumps(st.events()))
    assert traces.read_trace(tmp_path / "list.json")["traceEvents"]     # a bare event list is accepted


def test_attribute_follows_the_launch_not_the_gpu_time(events):
    step = traces.find_window(events, "ProfilerStep#1")
    ranges = traces.annotations(events, step, exclude=("ProfilerStep#1", "1F1B"))
    assert [r["name"] for r in ranges][:3] == ["combine(B)", "attn(F)", "dispatch(F)"]
    got = {}
    for g, i in traces.attribute(events, ranges):
        got.setdefault(None if i is None else ranges[i]["name"], []).append(g["ts"])
    # mlp(W)'s kernels run after dispatch(F)'s on the GPU but were launched in mlp(W)'s host range
    assert sorted(got["mlp(W)"]) == [450, 460]
    assert got[None] == [700]          # launched outside the step


def test_innermost_range_wins(events):
    step = traces.find_window(events, "ProfilerStep#1")
    with_container = traces.annotations(events, step, exclude=("ProfilerStep#1",))
    names = {with_container[i]["name"] for _, i in traces.attribute(events, with_container) if i is not None}
    assert "1F1B" not in names and "attn(F)" in names


def test_streams_overlap_and_exposed(events):
    gpu = [e for e in traces.gpu_events(events) if e["ts"] < 650]
    comm = [e for e in gpu if traces.stream_of(e) == 27]
    compute = [e for e in gpu if traces.stream_of(e) != 27]
    busy = traces.stream_busy(gpu)
    assert busy[27] == 370 and busy[23] == 60
    assert traces.busy(compute) == 490
    assert traces.overlap(comm, compute) == 340
    assert traces.exposed(comm, compute) == 30
    assert traces.span(gpu) == (100.0, 620.0)
    assert traces.intersect([(0, 10), (20, 30)], [(5, 25)]) == [(5, 10), (20, 25)]
    with pytest.raises(ValueError, match="no events"):
        traces.span([])


def test_phase_table(events):
    step = traces.find_window(events, "ProfilerStep#1")
    rows = traces.phase_table(events, step, exclude=("ProfilerStep#1", "1F1B"))
    byname = {r["name"]: r for r in rows}
    w = byname["mlp(W)"]
    assert (w["host_dur"], w["gpu_start"], w["gpu_end"], w["busy"]) == (10.0, 450.0, 520.0, 70.0)
    assert w["streams"] == {7: 50.0, 23: 60.0}
    assert byname["dispatch(F)"]["host_dur"] == 200 and byname["dispatch(F)"]["busy"] == 120

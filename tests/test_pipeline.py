"""The pipeline simulator: dependencies, schedules, bubbles and memory against DeepSeek's DualPipe README table."""
import pytest

from common.parallel import pipeline as P

STD = P.Durations(F=1, B=2, W=1, FB=2.5)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb1p", "dualpipe"])
@pytest.mark.parametrize("pp,m", [(4, 8), (8, 20), (8, 64), (16, 32)])
def test_bubble_matches_readme_formula_for_standard_timings(name, pp, m):
    r = P.run(name, pp, m, STD)
    assert r.bubble_max == pytest.approx(P.bubble_formula(name, pp, STD))


def test_recorded_standard_configuration():
    got = {name: P.run(name, 8, 20, STD) for name in P.SCHEDULES}
    assert {n: r.bubble_max for n, r in got.items()} == {"gpipe": 21, "1f1b": 21, "zb1p": 7, "dualpipe": 4.5}
    assert got["dualpipe"].bubble == pytest.approx(4.125)  # the mean: edge ranks idle less than middle ranks
    assert got["dualpipe"].makespan == 59 and got["1f1b"].makespan == 81


@pytest.mark.parametrize("pp", [4, 8, 16])
def test_memory_matches_readme_table(pp):
    m = 2 * pp + 4
    for name, params, acts in [("1f1b", 1, pp), ("zb1p", 1, pp), ("dualpipe", 2, pp + 1), ("gpipe", 1, m)]:
        r = P.run(name, pp, m, STD)
        assert max(r.parameters) == params == P.memory_formula(name, pp, m)["parameters"]
        assert max(r.peak_activations) == acts == P.memory_formula(name, pp, m)["activations"]


def test_zb1p_formula_holds_while_w_is_at_most_f_and_at_most_b_minus_w():
    pp = 8
    for F, B, W in [(1, 3, 1), (2, 3, 1), (1, 2, 0.5), (3, 5, 2)]:
        d = P.Durations(F, B, W)
        assert P.run("zb1p", pp, 24, d).bubble_max == pytest.approx(P.bubble_formula("zb1p", pp, d))
    # outside: per stage the bubble is max(F, B - W, F + B - 2W) -- no gap shorter than one F or one Bi
    for F, B, W in [(1, 1.5, 1), (1, 4, 2), (1, 2, 1.5)]:
        d = P.Durations(F, B, W)
        assert P.run("zb1p", pp, 24, d).bubble_max == pytest.approx((pp - 1) * max(F, B - W, F + B - 2 * W))


def test_every_device_does_all_its_work_once_and_busy_adds_up():
    d = P.Durations(1, 2, 1, 2.5)
    r = P.run("dualpipe", 8, 20, d)
    for dev in range(8):
        assert r.busy[dev] + r.idle[dev] == pytest.approx(r.makespan)
        kinds = [k for _, _, k, _ in r.spans[dev]]
        n_f = sum(1 if k == "F" else 0 for k in kinds) + kinds.count("FB")
        assert n_f == 20  # 10 micro-batches per direction, two stages per rank


def test_dependencies_are_respected_with_transfer_time():
    d = P.Durations(1, 2, 1, 2.5, comm=0.25)
    for name in P.SCHEDULES:
        r = P.run(name, 4, 8, d)
        end = {}
        for dev, spans in enumerate(r.spans):
            prev_end = 0.0
            for s, e, kind, op in spans:
                assert s >= prev_end - 1e-12  # one op at a time per device
                prev_end = e
                for item in op:
                    end[item[:1] + item[1:]] = (s, e, dev)
        for (kind, dr, st, j), (s, e, dev) in end.items():
            if kind == "F" and st > 0:
                ps, pe, pdev = end[("F", dr, st - 1, j)]
                assert s >= pe + (d.comm if pdev != dev else 0) - 1e-9
            if kind in ("B", "Bi") and st < 3:
                nxt = end.get(("B", dr, st + 1, j)) or end.get(("Bi", dr, st + 1, j))
                assert s >= nxt[1] + (d.comm if nxt[2] != dev else 0) - 1e-9
    assert P.run("1f1b", 4, 8, d).makespan > P.run("1f1b", 4, 8, STD).makespan


def test_deadlock_is_reported():
    s = P.one_f_one_b(4, 6)
    s.ops[3][0], s.ops[3][1] = s.ops[3][1], s.ops[3][0]  # last stage: backward before its forward
    with pytest.raises(P.Deadlock, match="deadlocks"):
        P.simulate(s)


def test_missing_or_duplicated_work_is_rejected():
    s = P.one_f_one_b(4, 6)
    del s.ops[1][3]
    with pytest.raises(ValueError, match="missing"):
        P.simulate(s)
    s = P.one_f_one_b(4, 6)
    s.ops[1].append(s.ops[1][0])
    with pytest.raises(ValueError, match="repeats"):
        P.simulate(s)
    s = P.one_f_one_b(4, 6)
    s.ops[0][0], s.ops[1][0] = s.ops[1][0], s.ops[0][0]
    with pytest.raises(ValueError, match="belongs to device"):
        P.simulate(s)


@pytest.mark.parametrize("pp,m,match", [(7, 20, "even pipeline size"), (8, 14, ">= 2\\*pp"),
                                        (8, 21, "even number"), (0, 20, "pipeline size")])
def test_dualpipe_bad_input(pp, m, match):
    with pytest.raises(ValueError, match=match):
        P.dualpipe(pp, m)


@pytest.mark.parametrize("kwargs,match", [({"F": 0}, "F=0"), ({"B": -1}, "B=-1"), ({"W": 0}, "W=0"),
                                          ({"W": 3}, "smaller than B"), ({"FB": 0}, "FB=0"),
                                          ({"comm": -0.1}, "comm=")])
def test_durations_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        P.Durations(**kwargs)


def test_bad_schedule_name_and_sizes():
    with pytest.raises(ValueError, match="allowed: gpipe"):
        P.build("pipedream", 4, 8)
    with pytest.raises(ValueError, match="micro_batches=0"):
        P.one_f_one_b(4, 0)


def test_one_f_one_b_order():
    assert P.one_f_one_b_order(3, 4, 0) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2),
                                             ("B", 3)]
    assert P.one_f_one_b_order(3, 4, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3),
                                             ("B", 3)]
    assert P.one_f_one_b_order(4, 2, 0) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


def test_dualpipe_overlap_shortens_makespan_and_fb_default_is_f_plus_b():
    no_gain = P.run("dualpipe", 8, 32, P.Durations(1, 2, 1))
    gain = P.run("dualpipe", 8, 32, P.Durations(1, 2, 1, 2.0))
    assert gain.makespan < no_gain.makespan
    assert P.Durations(1, 2, 1).fb == 3


def test_large_pipeline_is_fast_enough():
    import time
    t0 = time.process_time()
    r = P.run("zb1p", 32, 256, STD)
    assert time.process_time() - t0 < 5  # the benchmark shows PP=64 x 512 in well under a second
    assert r.bubble_max == pytest.approx(P.bubble_formula("zb1p", 32, STD))


def test_readme_table_and_plot():
    df = P.readme_table(pp_values=(4,), micro_batch_values=(8,))
    assert set(df["schedule"]) == set(P.SCHEDULES)
    import matplotlib
    matplotlib.use("Agg")
    ax = P.plot_timeline(P.run("dualpipe", 4, 8, STD))
    assert ax.get_title().startswith("dualpipe")


@pytest.mark.parametrize("pp,m", [(4, 8), (4, 9), (8, 20), (16, 40)])
def test_dualpipev_v_shape(pp, m):
    s = P.dualpipev(pp, m)
    assert s.stages == 2 * pp and s.directions == 1
    for r in range(pp):
        assert {st for (_, st), dev in s.placement.items() if dev == r} == {r, 2 * pp - 1 - r}
    r = P.run("dualpipev", pp, m, STD)
    # per chunk (half a 1F1B stage): the worst rank idles (PP-1)(F&B+B-3W); 1x parameters; 2PP+1 half-stage activations
    assert r.bubble_max == pytest.approx((pp - 1) * (STD.fb + STD.B - 3 * STD.W))
    assert max(r.parameters) == 1
    assert max(r.peak_activations) == pytest.approx(pp + 0.5)


def test_dualpipev_bad_input():
    with pytest.raises(ValueError, match="at least 2\\*pp"):
        P.dualpipev(8, 15)


# --- Megatron's interleaved 1F1B, F&B counts, DualPipe's formula gap
@pytest.mark.parametrize("pp,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 12), (8, 2, 16), (8, 4, 8)])
def test_interleaved_bubble_and_memory_match_megatron(pp, v, m):
    full = P.Durations(1, 2, 1, 2.5)
    r = P.run("interleaved", pp, m, P.Durations(1 / v, 2 / v, 1 / v, 2.5 / v), virtual_stages=v)
    assert r.bubble_max == pytest.approx(P.bubble_formula("interleaved", pp, full, v))
    assert r.bubble_max == pytest.approx((pp - 1) * 3 / v)
    # bubble / ideal step = (pp - 1) / (v m): the README-style fraction
    assert r.bubble_max / (m * 3) == pytest.approx((pp - 1) / (v * m))
    mem = P.memory_formula("interleaved", pp, m, v)
    assert max(r.peak_activations) == pytest.approx(mem["activations"])
    assert max(r.parameters) == pytest.approx(1)


def test_interleaved_order_visits_chunks_in_groups_of_pp():
    order = P.interleaved_order(2, 4, 0, 2)
    forwards = [(c, j) for k, c, j in order if k == "F"]
    assert forwards == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
    backwards = [(c, j) for k, c, j in order if k == "B"]
    assert backwards[:2] == [(1, 0), (1, 1)]


@pytest.mark.parametrize("kwargs,match", [({"pp": 4, "micro_batches": 6}, "micro_batches=6.*multiple of pp = 4"),
                                          ({"pp": 4, "micro_batches": 8, "virtual_stages": 1}, "virtual_stages=1")])
def test_interleaved_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        P.interleaved_1f1b(**kwargs)


def test_build_still_takes_three_arguments_and_names_interleaved():
    assert P.build("1f1b", 4, 8).name == "1f1b"
    with pytest.raises(ValueError, match="interleaved"):
        P.build("megatron", 4, 8)


def test_readme_table_with_interleaved_rows():
    t = P.readme_table((4,), (16,), virtual_stages=2)
    row = t[t["schedule"] == "interleaved v=2"].iloc[0]
    assert row["bubble sim (max)"] == pytest.approx(row["bubble formula"]) == pytest.approx(4.5)
    assert row["activations sim"] == pytest.approx(row["activations formula"]) == pytest.approx(5.5)
    assert "interleaved v=2" not in set(P.readme_table((4,), (16,))["schedule"])


def test_dualpipe_fb_pairs_per_rank():
    r = P.run("dualpipe", 8, 20, P.Durations(1, 2, 1, 2.5))
    assert P.fb_pairs(r) == [9, 10, 11, 11, 11, 11, 10, 9]   # not 16 of 20
    assert P.fb_pairs(P.build("1f1b", 4, 8)) == [0] * 4


def test_dualpipe_gap_rule_against_the_sweep():
    d = P.Durations(1, 1.25, 0.5)
    gap = P.run("dualpipe", 8, 32, d).bubble_max - P.bubble_formula("dualpipe", 8, d)
    assert gap == pytest.approx(0.75)              # the example: above the formula
    assert P.dualpipe_gap_rule(1, 1.25, 0.5) == 1
    assert P.dualpipe_gap_rule(1, 2, 1) == 0 and P.dualpipe_gap_rule(1, 3, 1) == -1
    sweep = P.dualpipe_formula_sweep(pp_values=(4, 8))
    assert (sweep["sign"] == sweep["rule"]).mean() >= 0.95
    assert (sweep["sign"] > 0).any() and (sweep["sign"] < 0).any()

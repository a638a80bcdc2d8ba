"""The promise of `make run STRICT=1`, on synthetic ledgers: a planted 2x slowdown is caught, and a busy machine
(heavy, seeded noise in every other result) flags nothing else.

The synthetic machine's speed is a random process in time: segments of exponential length, each quiet (speed 1,
give or take 4%) or busy (speed 0.25-0.9, other processes using the cores it lost). Each notebook runs 20 s between
two probe readings; each result is measured during 2 s of it, at a random moment, so a short burst of load can fall
between the probes. Speeds follow the machine to a power of 0.5-2 (a two-thread operation suffers more than the
probe), ratios to a power of -0.5..0.5, and every measured result has its own noise of 2-10%. The baseline is three
quiet runs. A notebook with a candidate is re-run later, at another moment of the same machine.
"""
import math

import numpy as np
import pytest

from common.core import baseline as bl

NB_S, PROBE_S, MEAS_S = 20.0, 0.5, 2.0


class Machine:
    def __init__(self, rng, mean_s=30.0, p_busy=0.4, lo=0.25, hi=0.9):
        self.rng, self.mean, self.p, self.lo, self.hi = rng, mean_s, p_busy, lo, hi
        self.edges, self.levels = [0.0], []

    def _level(self, ts):
        while self.edges[-1] < max(ts):
            self.edges.append(self.edges[-1] + self.rng.exponential(self.mean))
            busy = self.rng.random() < self.p
            self.levels.append(self.rng.uniform(self.lo, self.hi) if busy else math.exp(self.rng.normal(0, 0.04)))
        return np.array(self.levels)[np.searchsorted(self.edges, ts, side="right") - 1]

    def speed(self, t0, t1):
        return float(self._level(np.linspace(t0, t1, 16)).mean())

    def others(self, t0, t1):
        """Cores the other processes used on average: a busy level l took 2 (1 - l) of the 2 cores."""
        lv = self._level(np.linspace(t0, t1, 64))
        return float(np.where(lv < 0.95, np.clip(2 * (1 - lv), 0, 2), 0.02).mean())


def world(rng, labs=6, per_lab=5):
    specs = []
    for lab in range(labs):
        for j in range(per_lab):
            kind = str(rng.choice(["speed", "ratio", "deterministic"], p=[0.4, 0.4, 0.2]))
            unit = {"speed": str(rng.choice(["ms", "GB/s"])), "ratio": "x", "deterministic": "B"}[kind]
            specs.append({"name": f"lab{lab}.r{j}", "lab": f"lab{lab}", "kind": kind, "unit": unit,
                          "v0": float(rng.uniform(1, 100)), "sigma": float(rng.uniform(0.02, 0.10)),
                          "power": float(rng.uniform(0.5, 2.0) if kind == "speed" else rng.uniform(-0.5, 0.5)),
                          "hib": (unit != "ms") if kind == "speed" else bool(rng.random() < 0.5)})
    planted = next(s for s in specs if s["kind"] == "speed")
    planted.update(sigma=0.03, power=1.0)
    return specs, planted["name"]


def execute(rng, m, t, specs, lab, slow=None):
    """One notebook at time t: its records, its moment, and the time after it."""
    def probe(t0):
        s = m.speed(t0, t0 + PROBE_S)
        return {"copy_gbps": 30 * s * math.exp(rng.normal(0, 0.03)),
                "matmul_gflops": 150 * s * math.exp(rng.normal(0, 0.03))}
    before, records = probe(t), []
    for s in (s for s in specs if s["lab"] == lab):
        rec = {"name": s["name"], "lab": lab, "unit": s["unit"], "device": "cpu"}
        if s["kind"] == "deterministic":
            rec.update(value=s["v0"], measured=False)
        else:
            t0 = t + PROBE_S + rng.uniform(0, NB_S - MEAS_S)
            good = m.speed(t0, t0 + MEAS_S) ** s["power"] * math.exp(rng.normal(0, s["sigma"]))
            good /= 2.0 if s["name"] == slow else 1.0
            rec.update(value=s["v0"] * (good if s["hib"] else 1 / good), measured=True, higher_is_better=s["hib"])
        records.append(rec)
    moment = {"probes": [before, probe(t + PROBE_S + NB_S)], "others": m.others(t + PROBE_S, t + PROBE_S + NB_S)}
    return records, moment, t + 2 * (PROBE_S + NB_S)  # and the unsolved lab's run


def strict_run(rng, specs, slow, **machine):
    """Baseline from three quiet runs, then a STRICT run on `machine`: the rows after confirmation."""
    labs = sorted({s["lab"] for s in specs})

    def run(m, t, slow=None):
        records, moments = [], {}
        for lab in labs:
            recs, moments[lab], t = execute(rng, m, t, specs, lab, slow)
            records += recs
        return {"records": records, "moments": moments}, t

    quiet, t = Machine(rng, p_busy=0.0), 0.0
    runs = []
    for _ in range(3):
        got, t = run(quiet, t)
        runs.append(got)
    base = bl.make(runs, "cpu")
    m = Machine(rng, **machine)
    got, t = run(m, 0.0, slow)
    rows = bl.judge(got["records"], base["results"], got["moments"], base["probe"])
    again = []
    for lab in sorted({r["lab"] for r in bl.candidates(rows)}):
        recs, moment, t = execute(rng, m, t, specs, lab, slow)
        again += bl.judge(recs, base["results"], {lab: moment}, base["probe"])
    return bl.confirm(rows, again)


@pytest.mark.parametrize("machine, trials, least_caught", [
    (dict(p_busy=0.0), 60, 0.95),  # a quiet machine: the planted slowdown is caught in (nearly) every run
    (dict(p_busy=0.4), 80, 0.10),  # bursts of load of 30 s on average, down to a quarter of the speed
    (dict(p_busy=0.4, mean_s=8.0), 50, 0.04),  # short bursts, many of them between two probes
    (dict(p_busy=1.0, mean_s=300.0), 30, 0.0),  # busy throughout: another CPU-bound process all run long
])
def test_planted_slowdown_is_caught_and_nothing_else_is_flagged(machine, trials, least_caught):
    rng = np.random.default_rng(30)
    caught = 0
    for _ in range(trials):
        specs, planted = world(rng)
        for row in strict_run(rng, specs, planted, **machine):
            if row["name"] == planted:
                caught += row["status"] == "regression"
                # missed only when the machine could not be judged at that moment, in the run or its re-run
                assert row["status"] == "regression" or "machine drifted" in (row["status"],
                                                                              row.get("rerun_status")), row
            else:
                assert row["status"] not in ("regression", "changed", "regression?"), row
    assert caught >= least_caught * trials, f"caught the planted 2x in {caught} of {trials} runs"


def test_busy_machine_reports_drift_not_regressions():
    """A machine at half speed throughout: candidates are `machine drifted`, with the drift in each row."""
    rng = np.random.default_rng(1)
    specs, _ = world(rng)
    rows = strict_run(rng, specs, None, p_busy=1.0, mean_s=1e4, lo=0.45, hi=0.55)
    drifted = [r for r in rows if r["status"] == "machine drifted"]
    assert drifted and all(r["machine"]["drifted"] and r["machine"]["drift"] < -0.3 for r in drifted)
    assert not [r for r in rows if r["status"] in ("regression", "regression?", "not confirmed")]

"""Speed of the pipeline simulator (the five schedules and interleaved 1F1B): PP=64 with 512 micro-batches must take under one second on one CPU core.

Run: .venv/bin/python benchmarks/pipeline_bench.py
Prints, per schedule and size, the number of operations, the best-of-3 CPU time (time.process_time, one process, one
thread: the simulator is pure Python) of building + simulating, and the ratio to the one-second target.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.parallel import pipeline

TARGET_S = 1.0
SIZES = [(8, 20), (16, 128), (64, 512)]


def best_of(fn, n=3):
    best = float("inf")
    for _ in range(n):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def main() -> int:
    d = pipeline.Durations(F=1, B=2, W=1, FB=2.5, comm=0.1)
    print(f"{'schedule':>9} {'PP':>4} {'micro-batches':>13} {'ops':>7} {'cpu_s':>7} {'ops/s':>9} "
          f"{'target/cpu':>10}  bubble(max)")
    worst = 0.0
    for pp, m in SIZES:
        for name in pipeline.ALL_SCHEDULES:
            secs, res = best_of(lambda: pipeline.run(name, pp, m, d))
            ops = sum(len(o) for o in res.schedule.ops)
            if (pp, m) == SIZES[-1]:
                worst = max(worst, secs)
            print(f"{name:>9} {pp:>4} {m:>13} {ops:>7} {secs:>7.3f} {ops / secs:>9.0f} {TARGET_S / secs:>10.1f}  "
                  f"{res.bubble_max:.2f}")
        if m % pp == 0:  # Megatron's interleaved 1F1B, v = 2 (chunk times halved: the same model)
            half = pipeline.Durations(d.F / 2, d.B / 2, d.W / 2, d.fb / 2, d.comm)
            secs, res = best_of(lambda: pipeline.run(pipeline.INTERLEAVED, pp, m, half, virtual_stages=2))
            ops = sum(len(o) for o in res.schedule.ops)
            if (pp, m) == SIZES[-1]:
                worst = max(worst, secs)
            print(f"{'interl.v2':>9} {pp:>4} {m:>13} {ops:>7} {secs:>7.3f} {ops / secs:>9.0f} "
                  f"{TARGET_S / secs:>10.1f}  {res.bubble_max:.2f}")
    ok = worst < TARGET_S
    print(f"\nslowest schedule at PP={SIZES[-1][0]}, {SIZES[-1][1]} micro-batches: {worst:.3f} s CPU "
          f"({'within' if ok else 'OVER'} the {TARGET_S:g} s target, {TARGET_S / worst:.1f}x margin)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Speed of lab 06's MoE code at DeepSeek-V3 sizes: one table, with the ratio to each target.

- routing: DeepSeek-V3 gate (sigmoid, bias, 8 groups keep 4, top-8) on 1M tokens x 256 experts, then the dispatch
  plan (stable sort by expert, counts, offsets); target: a few seconds on 2 CPU cores;
- dispatch/combine: sorted/grouped MoE layer vs the per-token loop and the dense masked reference;
- EPLB: 58 layers x 256 experts onto 64 GPUs (8 nodes), 320 physical slots, hierarchical and global; target: < 1 s.

Usage: .venv/bin/python benchmarks/moe_bench.py [--tokens 1048576] [--hidden 0] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from common.moe import eplb, moe


def timed(fn, repeats: int):
    """(median wall seconds, median CPU seconds of this process) over `repeats` calls after one warm-up call."""
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--hidden", type=int, default=0, help="also gather token rows of this width in dispatch")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    t = args.tokens
    logits = torch.randn(t, 256)
    bias = torch.randn(256) * 0.05
    x = torch.randn(t, args.hidden) if args.hidden else None

    def route():
        return moe.deepseek_v3_gate(logits, bias, 8, 8, 4, 2.5)

    def route_and_dispatch():
        w, i = route()
        plan = moe.dispatch_plan(i, 256)
        if x is not None:
            moe.dispatch(x, plan)
        return plan

    _, idx = route()
    wall, cpu = timed(route, args.repeats)
    rows.append(("gate: 1M tokens x 256 experts, top-8", wall, cpu, 5.0))
    wall, cpu = timed(lambda: moe.dispatch_plan(idx, 256), args.repeats)
    rows.append(("dispatch plan: sort 8M assignments", wall, cpu, None))
    wall, cpu = timed(route_and_dispatch, args.repeats)
    rows.append((f"gate + dispatch{' + gather h=%d' % args.hidden if args.hidden else ''}", wall, cpu, 5.0))
    del logits, idx

    # a sorted MoE layer vs the references (small experts: the loop's overhead shows)
    T, E, K, H, F = 2048, 32, 4, 64, 128
    xs = torch.randn(T, H)
    ex = moe.make_experts(E, H, F, seed=1)
    w, i = moe.deepseek_v3_gate(torch.randn(T, E), None, K, 1, 1, 1.0)
    torch.testing.assert_close(moe.moe_grouped(xs, w, i, ex), moe.moe_dense_reference(xs, w, i, ex),
                               rtol=1e-4, atol=1e-4)
    g_wall, g_cpu = timed(lambda: moe.moe_grouped(xs, w, i, ex), args.repeats)
    d_wall, d_cpu = timed(lambda: moe.moe_dense_reference(xs, w, i, ex), 1)
    n_wall, n_cpu = timed(lambda: moe.moe_naive(xs[:128], w[:128], i[:128], ex), 1)
    n_wall, n_cpu = n_wall * T / 128, n_cpu * T / 128
    rows.append((f"MoE layer sorted/grouped (T={T}, E={E}, k={K}, h={H})", g_wall, g_cpu, None))
    rows.append(("  dense masked reference", d_wall, d_cpu, None))
    rows.append(("  per-token loop (extrapolated from 128 tokens)", n_wall, n_cpu, None))

    weight = torch.rand(58, 256, generator=torch.Generator().manual_seed(0)) ** 3 * 1000
    wall, cpu = timed(lambda: eplb.rebalance_experts(weight, 320, 8, 8, 64), args.repeats)
    rows.append(("EPLB hierarchical: 58 x 256 -> 64 GPUs, 320 slots", wall, cpu, 1.0))
    wall, cpu = timed(lambda: eplb.rebalance_experts(weight, 320, 1, 8, 64), args.repeats)
    rows.append(("EPLB global: 58 x 256 -> 64 GPUs, 320 slots", wall, cpu, 1.0))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, tokens {t}")
    print(f"{'what':58s} {'wall s':>8s} {'cpu s':>8s} {'target s':>9s} {'wall/target':>12s}")
    for name, wall, cpu, target in rows:
        tgt = f"{target:9.1f}" if target else f"{'':9s}"
        ratio = f"{wall / target:12.2f}" if target else f"{'':12s}"
        print(f"{name:58s} {wall:8.3f} {cpu:8.3f} {tgt} {ratio}")
    print(f"sorted layer vs per-token loop: {n_wall / g_wall:.0f}x faster; vs dense reference: "
          f"{d_wall / g_wall:.1f}x faster")


if __name__ == "__main__":
    main()

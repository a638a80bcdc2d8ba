"""`torchrun --nnodes N --nproc-per-node G -m common.parallel.expert_parallel`: lab 07's expert-parallel layer on
every rank (the node-aware variant with the real nodes: G ranks per node), fp32 and FP8/BF16; rank 0 prints the
error and bytes and records ep.dispatch.max_abs_err, ep.exchange.bytes_ratio and ep.dedup.bytes_saving."""
import os

from common.core import results
from common.parallel import torchrun
from common.parallel.distributed import tasks_worker
from common.parallel.expert_parallel.config import EPConfig
from common.parallel.expert_parallel.summary import summarize
from common.parallel.expert_parallel.worker import ep_task

ap = torchrun.parser("Expert-parallel dispatch and combine, flat and node-aware",
                     "common.parallel.expert_parallel")
ap.add_argument("--tokens-per-rank", type=int, default=4096)
ap.add_argument("--hidden", type=int, default=7168)
ap.add_argument("--num-experts", type=int, default=256)
ap.add_argument("--top-k", type=int, default=8)
ap.add_argument("--repeats", type=int, default=5)
ap.add_argument("--ranks-per-node", type=int, default=None,
                help="default: the real nodes (LOCAL_WORLD_SIZE); fewer simulate nodes on one machine")
a = torchrun.parse(ap)
world = torchrun.world_size()
exact = EPConfig(tokens=a.tokens_per_rank * world, hidden=a.hidden, intermediate=32, num_experts=a.num_experts,
                 top_k=a.top_k, n_group=min(8, a.num_experts), topk_group=min(4, a.num_experts),
                 ranks_per_node=a.ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", world)))
low = EPConfig(**{**exact.to_dict(), "fp8": True, "combine_bf16": True})


def report(per_rank):
    run32 = summarize([r[0] for r in per_rank], exact)
    run8 = summarize([r[1] for r in per_rank], low)
    for name, run in (("fp32", run32), ("FP8 dispatch, BF16 combine", run8)):
        for v, s in run["variants"].items():
            print(f"{name:27s} {v:10s} max_abs_err {s['max_abs_err']:.3g}  cross-node MB {s['ib'] / 1e6:.3f} "
                  f"(model {s['model_ib_bytes'] / 1e6:.3f})  layer {s['seconds'] * 1e3:.2f} ms")
    err = max(s["max_abs_err"] for s in run32["variants"].values())
    results.record("ep.dispatch.max_abs_err", err, "abs", higher_is_better=False,
                   note=f"fp32 EP layer on {world} ranks vs the single-process grouped layer (torchrun)")
    if run8["nodes"] == 1:
        print("one node: no byte crosses nodes, so ep.exchange.bytes_ratio and ep.dedup.bytes_saving are not "
              "recorded (--ranks-per-node below the ranks of a node simulates nodes)")
        return
    results.record("ep.exchange.bytes_ratio", run8["variants"]["node_aware"]["bytes_ratio"], "ratio",
                   note="node-aware cross-node bytes of dispatch + combine / lab 06's ep_traffic model (torchrun)")
    results.record("ep.dedup.bytes_saving", run8["dedup_bytes_saving"], "fraction",
                   note=f"1 - node-aware / flat cross-node bytes, {run8['nodes']} nodes (torchrun)")


tasks = [ep_task(exact, world, a.backend, repeats=a.repeats), ep_task(low, world, a.backend, repeats=a.repeats)]
torchrun.main("07_collectives", tasks_worker, (tasks,), report, a.backend)

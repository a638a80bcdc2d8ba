"""`torchrun --nnodes N --nproc-per-node G -m common.parallel.pipeline_run`: lab 08's schedules on real ranks, one
pipeline stage (or DualPipe's pair of stages) per rank; rank 0 prints the measured-vs-simulated table and records
pp.real.grad_max_err and pp.real.bubble_ratio (pipeline of 2) or pp.real.pp<N>.* (of N), as lab 08 does."""
from common.core import results
from common.parallel import torchrun
from common.parallel.pipeline_run.summary import compare, ledger_names
from common.parallel.pipeline_run.worker import pipeline_task, summarize_all

ap = torchrun.parser("Pipeline schedules (GPipe, 1F1B, ZB1P, DualPipe, DualPipeV, interleaved) executed on real ranks",
                     "common.parallel.pipeline_run")
ap.add_argument("--schedules", default="1f1b,zb1p,dualpipe,dualpipev", help="comma-separated")
ap.add_argument("--micro-batches", type=int, default=None, help="default: 2 x ranks, at least 8")
ap.add_argument("--batch", type=int, default=None, help="default: 16 rows per micro-batch")
ap.add_argument("--blocks", type=int, default=None, help="residual MLP blocks; default: 2 x ranks")
ap.add_argument("--hidden", type=int, default=256)
ap.add_argument("--repeats", type=int, default=5)
a = torchrun.parse(ap)
pp = torchrun.world_size()
m = a.micro_batches or max(8, 2 * pp)
names = tuple(n for n in a.schedules.split(",") if n)
worker, args = pipeline_task(names, pp, m, a.batch or 16 * m, a.blocks or 2 * pp, a.hidden, a.repeats, a.backend)


def report(per_rank):
    res = summarize_all(per_rank, pp, m)
    print(compare(res).to_string(float_format=lambda v: f"{v:.3g}"))
    keys = ledger_names(pp)
    err = max(r["max_grad_err"] for r in res.values())
    results.record(keys["grad_max_err"], err, "abs", measured=True,
                   note=f"worst over {', '.join(res)} on {pp} ranks vs one process (fp32, torchrun)")
    if "1f1b" in res:
        results.record(keys["bubble_ratio"], res["1f1b"]["bubble_ratio"], "ratio", measured=True,
                       note=f"1F1B on {pp} ranks: measured idle / simulated idle with measured op times (torchrun)")


torchrun.main("08_pipeline_dualpipe", worker, args, report, a.backend)

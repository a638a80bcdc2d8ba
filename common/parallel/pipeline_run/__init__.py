"""Pipeline schedules executed on real ranks: each rank runs ITS op list from `common.parallel.pipeline.build(...)`
-- the very schedule the simulator runs -- on a small model (residual MLP blocks) cut into the schedule's stages.

- `F`: forward of one micro-batch through one stage; its output goes to the next stage's rank (the last stage
  computes the loss instead). `B`: full backward; the input gradient goes back to the previous stage's rank.
- `Bi` / `W` (zero-bubble split; DualPipe's edges): `Bi` computes the input gradient only and queues the linear
  layers' weight parts (as DualPipe's `WeightGradStore`); the matching `W` computes them.
- `FB` (DualPipe's F&B pair): a forward and a backward of two different stages; on a GPU each stage has a CUDA
  stream of its own, so the two halves are queued on two streams and overlap; on a CPU one after the other.
- DualPipe holds two copies of the model (rank r: stage r of direction 0, stage pp-1-r of direction 1), fed from
  the two ends; after the step each copy's gradient is summed with its mirror's (one batched exchange with rank
  pp-1-r), and every rank takes an SGD step. DualPipeV cuts the model in 2 pp stages, laid as a V; interleaved 1F1B
  in 2 pp stages, rank r holding stages r and r + pp.

Each rank's plan (`plan.make`, before any process starts) lists its point-to-point batches -- every send and
receive -- and is checked under NCCL's rules (a send waits for its receive, a batch is one work, one stream per
rank): the receives are posted ahead of the compute, with the previous op's sends, as DualPipe's runtime does.
Tensors live on the rank's `worker_device()` (its GPU under NCCL); a backend the machine cannot run is refused before
a process starts. Measured per rank (median of `repeats` steps after a warm-up): each op's span -- its work only,
receive waits excluded; host clock on a CPU, CUDA events on a GPU, read once per step -- busy (the spans) and idle
(step minus busy); the peak of the activation bytes really alive (`stage`); and the first step's gradients and
stepped weights against one process running the whole batch through the whole model.

Modules: `model`, `stage` (a rank's stages and live bytes), `plan` (each rank's batches, checked), `p2p` (a step's
messages as the plan says), `executor` (one rank's step), `worker` (on real ranks), `summary` (beside the
simulator), `torch_engine` (the same model under torch.distributed.pipelining); `python -m
common.parallel.pipeline_run` is the torchrun entry point. Imports common.core and common.parallel.{pipeline,ranks,distributed}; imported by lab
08 and common.exercises.
"""
from common.parallel.pipeline_run import plan
from common.parallel.pipeline_run.executor import RUNNABLE, EventClock, HostClock, check_args, run_op, run_step
from common.parallel.pipeline_run.model import (
                                                WeightGradStore,
                                                loss_of,
                                                make_batch,
                                                make_model,
                                                reference_gradients,
                                                stage_forward,
)
from common.parallel.pipeline_run.p2p import PointToPoint, torch_transport
from common.parallel.pipeline_run.plan import RankPlan, inputs_of, output_of
from common.parallel.pipeline_run.stage import LiveBytes, Stage
from common.parallel.pipeline_run.summary import compare, ledger_names, summarize
from common.parallel.pipeline_run.torch_engine import engines_task, engines_worker, grad_max_err, run_engines, table
from common.parallel.pipeline_run.worker import (
                                                 one_way_time,
                                                 pipeline_task,
                                                 pipeline_worker,
                                                 run_schedule,
                                                 run_schedules,
                                                 summarize_all,
)

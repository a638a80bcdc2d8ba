"""Pipeline schedules executed on real ranks: each rank runs ITS op list from `common.parallel.pipeline.build(...)`
-- the very schedule the simulator runs -- on a small model (residual MLP blocks) cut into the schedule's stages.

- `F`: forward of one micro-batch through one stage; its output goes to the next stage's rank (the last stage
  computes the loss instead). `B`: full backward; the input gradient goes back to the previous stage's rank.
- `Bi` / `W` (zero-bubble split; DualPipe's edges): `Bi` computes the input gradient only and queues the linear
  layers' weight parts (as DualPipe's `WeightGradStore`); the matching `W` computes them.
- `FB` (DualPipe's F&B pair): the forward, then the backward (a CPU has no second engine to overlap them on).
- DualPipe holds two copies of the model (rank r: stage r of direction 0, stage pp-1-r of direction 1), fed from
  the two ends; a stage's gradient is the sum of its copies'. DualPipeV cuts the model in 2 pp stages, laid as a V.

Messages are batched `batch_isend_irecv` calls matched in each sender's order (`p2p`), tensors live on the rank's
`worker_device()` (its GPU under NCCL), and a backend the machine cannot run is refused before a process starts.
Measured per rank (median of `repeats` steps after a warm-up): each op's span -- its work only, receive waits
excluded; busy (the spans) and idle (step minus busy); the peak of the activation bytes really alive (`stage`);
and the gradients against one process running the whole batch through the whole model.

Modules: `model`, `stage` (a rank's stages and live bytes), `p2p` (ordered batched messages), `executor` (one
rank's step), `worker` (on real ranks), `summary` (beside the simulator); `python -m common.parallel.pipeline_run`
is the torchrun entry point. Imports common.core and common.parallel.{pipeline,ranks,distributed}; imported by lab
08 and common.exercises.
"""
from common.parallel.pipeline_run.executor import RUNNABLE, check_args, inputs_of, output_of, run_op, run_step
from common.parallel.pipeline_run.model import (
                                                WeightGradStore,
                                                loss_of,
                                                make_batch,
                                                make_model,
                                                reference_gradients,
                                                stage_forward,
)
from common.parallel.pipeline_run.p2p import PointToPoint, messages, torch_transport
from common.parallel.pipeline_run.stage import LiveBytes, Stage
from common.parallel.pipeline_run.summary import compare, ledger_names, summarize
from common.parallel.pipeline_run.worker import (
                                                 one_way_time,
                                                 pipeline_task,
                                                 pipeline_worker,
                                                 run_schedule,
                                                 run_schedules,
                                                 summarize_all,
)

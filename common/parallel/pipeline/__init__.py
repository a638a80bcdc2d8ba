"""Pipeline-parallel schedules, simulated: GPipe, 1F1B, ZB1P (zero bubble, ZB-H1), interleaved 1F1B, DualPipe and
DualPipeV. One namespace for the labs (`from common.parallel import pipeline`), one module per concern behind it:
- `schedules`: every device's ordered op list (`build(name, pp, micro_batches)`) and the chunk `Durations`;
- `simulator`: `simulate` runs a schedule event by event (bubble, peak activations, parameters, deadlocks);
- `formulas`: DeepSeek's README formulas for bubble and memory beside the simulator, and where DualPipe leaves them;
- `timeline`: the Gantt chart of a simulated run;
- `tokens`: one DualPipe rank's order as DeepSeek's runtime reads it ("F0", "Bi1", "W", "F0&B1", ...).

The README formulas of DeepSeek's DualPipe (1F1B: (PP-1)(F+B), ZB1P: (PP-1)(F+B-2W), DualPipe: (PP/2-1)(F&B+B-3W))
give the idle time of one device, in the time unit of F, B, W; the simulator measures it.
"""
from common.parallel.pipeline.formulas import (
                                               bubble_formula,
                                               dualpipe_formula_sweep,
                                               dualpipe_gap_rule,
                                               memory_formula,
                                               readme_table,
)
from common.parallel.pipeline.schedules import (
                                               ALL_SCHEDULES,
                                               INTERLEAVED,
                                               KIND_COLORS,
                                               KIND_NAMES,
                                               SCHEDULES,
                                               Durations,
                                               Schedule,
                                               build,
                                               check_dualpipe_args,
                                               dualpipe,
                                               dualpipe_stages,
                                               dualpipev,
                                               gpipe,
                                               interleaved_1f1b,
                                               interleaved_order,
                                               one_f_one_b,
                                               one_f_one_b_order,
                                               zb1p,
)
from common.parallel.pipeline.simulator import Deadlock, Result, fb_pairs, run, simulate, validate
from common.parallel.pipeline.timeline import plot_timeline
from common.parallel.pipeline.tokens import STEPS, TOKENS, dualpipe_tokens, schedule_from, steps_of, to_ops, to_tokens

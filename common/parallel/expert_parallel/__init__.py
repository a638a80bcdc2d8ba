"""Expert parallelism on real ranks: DeepEP-style dispatch and combine with `all_to_all_single` and split sizes.

Experts are sharded over R ranks (rank r holds experts r*E/R .. (r+1)*E/R - 1); consecutive groups of
`ranks_per_node` ranks form a node (simulated nodes on a CPU, real ones under torchrun). Each rank routes its own
tokens with the DeepSeek-V3 gate (`common.moe.moe.deepseek_v3_gate`), exchanges row counts with its peers, sends
token rows with `all_to_all_single(output_split_sizes=..., input_split_sizes=...)`, the experts run on the rows they
received, and the results come back (the same exchange with the splits swapped) for the weighted combine.

Two variants:
- "flat": one copy per (token, expert), sent to the expert's rank on the world group -- an all-to-all of lab 06's
  dispatched rows; the origin applies the gate weights when the rows come back.
- "node_aware" (DeepEP's normal kernels): one copy per (token, destination node), sent to the rank with the
  sender's local index on that node, on the group of the ranks with that local index (the RDMA hop: your own
  node's copy goes to yourself), then one copy per (token, destination rank) on the node's group (the NVLink hop).
  Experts apply the gate weights; combine sums inside the node first, so one row per (token, node) crosses nodes on
  the way back too.

Payload: dispatch rows in float32 (the exact check) or FP8 E4M3 with one float32 scale per 128 elements (DeepSeek-V3's
dispatch); combine rows in float32 or bfloat16; the k expert ids and weights ride in the same row. Every exchange is
recorded as it was made -- its split lists, its off-rank bytes per link class ("ib" to another node, "nvlink"
inside it), payload and metadata apart -- so the bytes can be set beside lab 06's model and the split lists beside
exercise 7.4's answer.

Modules: `config` (EPConfig, checks, send counts, each rank's routing), `rows` (encoding), `exchange` (the hops'
groups and the recorded all-to-all), `layer` (the two variants), `worker` (ep_worker, ep_task, measure), `summary`;
`python -m common.parallel.expert_parallel` is the torchrun entry point. Imports common.core, common.moe and
common.parallel.ranks/distributed; imported by the labs and common.exercises.
"""
from common.parallel.expert_parallel.config import (
                                                    SCALE_BLOCK,
                                                    EPConfig,
                                                    check_config,
                                                    flat_send_counts,
                                                    node_send_counts,
                                                    rank_inputs,
)
from common.parallel.expert_parallel.exchange import Exchange, hop_groups, hop_lists
from common.parallel.expert_parallel.layer import FORWARD, VARIANTS, flat_forward, grouped_experts, node_aware_forward
from common.parallel.expert_parallel.rows import (
                                                    FP8_MAX,
                                                    combine_row_bytes,
                                                    decode_fp8,
                                                    dispatch_row_bytes,
                                                    encode_fp8,
)
from common.parallel.expert_parallel.summary import global_indices, model_ib_bytes, predict_seconds, summarize
from common.parallel.expert_parallel.worker import FIRST_DISPATCH, ep_task, ep_worker, measure

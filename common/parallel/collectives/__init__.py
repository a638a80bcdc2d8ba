"""Collective communication: alpha-beta cost models, nccl-tests' bus bandwidth, measured sweeps, and a fitted model.
One namespace for the labs (`from common.parallel import collectives`), one module per concern behind it:
`cost_model` (the formulas below and bus factors), `links` (datasheet and measured link bandwidths), `scenarios`
(DeepSeek-V3's collectives sized), `fit` (alpha and B fitted to measured times), `sweep` (the measurement on real
ranks, and the torchrun entry point `python -m common.parallel.collectives`), `ring` (a ring all-reduce from
point-to-point messages, and a learner's run on real ranks beside dist.all_reduce).

The alpha-beta model: sending a message of n bytes over one link costs alpha + n / B (alpha: the fixed latency of a
step, seconds; B: the link's bandwidth in one direction, bytes/s; "beta" is 1/B). A collective over p ranks is a
sequence of steps; its time is (number of steps) * alpha + (bytes each rank sends in sequence) / B:

    ring all-reduce          2(p-1) alpha + 2(p-1)/p * n/B   (reduce-scatter, then all-gather; n = buffer per rank)
    ring reduce-scatter       (p-1) alpha +  (p-1)/p * n/B   (n = input buffer per rank; each rank keeps n/p)
    ring all-gather           (p-1) alpha +  (p-1)/p * n/B   (n = gathered output per rank; each rank owns n/p)
    all-to-all (pairwise)     (p-1) alpha +  (p-1)/p * n/B   (n = bytes each rank sends, its own share included)
    binary-tree all-reduce   2 ceil(log2 p) (alpha + n/B)    (reduce to the root, broadcast back; not pipelined)
    recursive doubling       ceil(log2 p) (alpha + n/B)      (log2 p exchanges of the whole buffer)
    Rabenseifner             2 log2(p) alpha + 2(p-1)/p * n/B (recursive halving + doubling)
    hierarchical all-reduce  reduce-scatter inside each node (NVLink), all-reduce of n/g across nodes (InfiniBand,
                             g rings in parallel, one per GPU and NIC), all-gather inside each node

nccl-tests report algbw = n / t and busbw = algbw * bus_factor, where the bus factor (all-reduce 2(p-1)/p; all-gather,
reduce-scatter and all-to-all (p-1)/p; broadcast and reduce 1) makes busbw comparable with the link bandwidth B:
a bandwidth-optimal algorithm has busbw -> B for large messages, whatever p is.
"""
from common.parallel.collectives.cost_model import (
                                                    ALLREDUCE_ALGORITHMS,
                                                    ALLREDUCE_TIMES,
                                                    COLLECTIVES,
                                                    DTYPE_BYTES,
                                                    algbw,
                                                    allreduce_time,
                                                    alltoall_time,
                                                    bus_factor,
                                                    busbw,
                                                    check_bytes,
                                                    check_collective,
                                                    check_ranks,
                                                    collective_time,
                                                    flat_ring_allreduce_time,
                                                    hierarchical_allreduce_time,
                                                    rabenseifner_allreduce_time,
                                                    recursive_doubling_allreduce_time,
                                                    ring_allgather_time,
                                                    ring_allreduce_time,
                                                    ring_reduce_scatter_time,
                                                    steps,
                                                    tree_allreduce_time,
                                                    two_level_alltoall_time,
)
from common.parallel.collectives.fit import Fit, fit_alpha_beta
from common.parallel.collectives.links import (
                                                    derating_table,
                                                    h800_vs_h100_allreduce_ratio,
                                                    ib_bandwidth,
                                                    measured_comm,
                                                    nvlink_allreduce_time,
                                                    nvlink_bandwidth,
)
from common.parallel.collectives.ring import ring_all_reduce, ring_task, summarize_ring
from common.parallel.collectives.scenarios import comm_scenarios, ep_alltoall_time, v3_copies_per_token
from common.parallel.collectives.sweep import (
                                                    Sweep,
                                                    combine,
                                                    elements_for,
                                                    iterations_for,
                                                    log_sizes,
                                                    main,
                                                    measure,
                                                    sweep_task,
                                                    sweep_worker,
)

"""Lab 12's workload and the tools of its profiling loop: a DeepSeek-V3-shaped MoE block, naive first, then changed
one candidate at a time, each verified, timed in pairs against the version it would replace and kept or reverted by
a paired guard.

One namespace for the lab (`from common.systems import capstone`), one module per concern behind it:
- `config`: `BlockConfig` (QUICK, FULL, `config_for`), `Version`, `BASELINE`, `CANDIDATES`, `apply`;
- `experts`: SwiGLU experts, the naive per-expert loop (Hugging Face's DeepSeek training branch), the sorted
  dispatch (its inference branch, made trainable) and the grouped layer (one batched GEMM per weight over
  zero-padded expert slots);
- `block`: the weights, the pieces (RMSNorm, MLA projections, eager and SDPA attention, the gate), `Block`, `step`;
- `verify`: outputs and gradients against the baseline's (`equivalent`, `verify`);
- `profiling`: `profile_step` (a trace read per component), `profiler_overhead` (warm, alternating, under a
  profiler schedule), `corrected_share`, `amdahl`;
- `guard`: `keep_or_revert` (paired ratios in random order, a distribution-free 90% interval, a 2% bar),
  `try_change`, `plot_waterfall`;
- `costs`: FLOPs and bytes per part of a DeepSeek-V3 layer and of the block, roofline-predicted times, rankings;
  `step_flops_and_bytes` (torch's counters).
`python -m common.systems.capstone --version kept --steps 5` runs steps for nsys / ncu on a GPU (NVTX ranges).

Imports common.core, common.facts, common.moe and common.systems.v3.model; imported by lab 12's checkers.
"""
from common.systems.capstone.block import (
    COMPONENTS,
    LAYERS,
    Block,
    balanced_bias,
    causal_mask,
    eager_attention,
    make_input,
    make_params,
    norm_for,
    rmsnorm_eager,
    rmsnorm_fused,
    sdpa_attention,
    step,
)
from common.systems.capstone.config import (
    BASELINE,
    CANDIDATES,
    FULL,
    QUICK,
    BlockConfig,
    Version,
    all_applied,
    apply,
    as_dict,
    config_for,
    from_dict,
)
from common.systems.capstone.costs import (
    LayerShape,
    block_layer,
    kernels,
    mla_vs_mha_kv_flops,
    predicted_times,
    ranking,
    shares,
    step_flops_and_bytes,
    v3_layer,
    v3_predicted_times,
)
from common.systems.capstone.experts import (
    ffn,
    moe_grouped_forward,
    moe_loop_forward,
    moe_sorted_forward,
    padded_slots,
    padding_waste,
    swiglu,
)
from common.systems.capstone.guard import (
    BAR,
    DECISIONS,
    LEVEL,
    Verdict,
    coverage,
    decide,
    judge,
    keep_or_revert,
    median_interval,
    median_rank,
    paired_ratios,
    plot_waterfall,
    try_change,
)
from common.systems.capstone.profiling import (
    Overhead,
    StepProfile,
    amdahl,
    busy_shares,
    corrected_share,
    overhead_per_op,
    profile_step,
    profiler_overhead,
    read_profile,
)
from common.systems.capstone.verify import (
    equivalent,
    max_abs_error,
    outputs_and_grads,
    verify,
    worst_relative_errors,
)

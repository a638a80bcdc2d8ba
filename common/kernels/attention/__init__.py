"""Attention three ways -- naive, tiled (FlashAttention's algorithm in PyTorch) and a Triton kernel -- with HBM bytes.

Tensors are laid out (batch, heads, seq_len, head_dim) as for `torch.nn.functional.scaled_dot_product_attention`.
One namespace for the labs (`from common.kernels import attention`), one module per concern behind it:
- `reference`: the float64 yardstick; `naive_attention` materialises S = Q K^T and P = softmax(S);
  `online_softmax_stats` is the one-pass running max and normaliser of Milakov and Gimelshein (2018);
  `tiled_attention` is FlashAttention's forward in PyTorch (blocks of Q, a loop over blocks of K and V, a running
  max, sum and output rescaled whenever the max grows; never the N x N matrix); `tiled_attention_backward` recomputes P
  from Q, K and L (D = rowsum(dO * O)). Each counts its HBM bytes in an `HBMCounter`.
- `io_bytes`: the same counts in closed form (`standard_io_bytes`, `flash_io_bytes`, `flash_bwd_io_bytes`), counted on
  meta tensors (`count_*_bytes`), and `flash_io_theta`, the shape of FlashAttention's IO complexity (Dao et al. 2022,
  arXiv 2205.14135, Theorem 2): Theta(N^2 d^2 / M).
- `triton_kernels`: the kernels' source; `triton_forward`: `launch_forward` (the lab's exercise) and `flash_attention`
  (causal or not, any length, head dims 16-256, optionally the logsumexp L); `triton_backward`:
  `flash_attention_backward` (dK, dV by key block, dQ by query block: no atomics) and `flash_attn_func`, the
  differentiable pair.
- `launch_configs`: GPU configurations pruned by the device's shared memory per block (`data/hardware.json`); a shape
  that fits none is refused with a ValueError; ahead-of-time compilation for sm_90 without a GPU.
- `bench`: the implementations timed across sequence lengths, verified against SDPA first.

Triton is imported lazily, so importing this package never fixes Triton's mode: call `common.setup()` first.
"""
from common.kernels.attention.bench import (
                                            IMPLEMENTATIONS,
                                            PASS_FLOP_FACTOR,
                                            PASSES,
                                            benchmark,
                                            implementation,
                                            ratio_table,
                                            sdpa_backend,
                                            seconds_per_flop,
                                            softmax_seconds_per_element,
                                            train_benchmark,
                                            train_ratio_table,
)
from common.kernels.attention.io_bytes import (
                                            blocks_for_memory,
                                            count_flash_bwd_bytes,
                                            count_flash_bytes,
                                            count_standard_bytes,
                                            flash_bwd_io_bytes,
                                            flash_io_bytes,
                                            flash_io_theta,
                                            naive_moved_bytes,
                                            on_chip_bytes,
                                            standard_io_bytes,
                                            tiled_eager_bytes,
)
from common.kernels.attention.launch_configs import (
                                            BWD_GPU_CONFIGS,
                                            GPU_CONFIGS,
                                            aot_table,
                                            compile_for_gpu,
                                            fitting_configs,
                                            registers_and_spills,
                                            smem_estimate_bytes,
                                            smem_per_block_bytes,
)
from common.kernels.attention.reference import (
                                            HBMCounter,
                                            attention_flops,
                                            causal_mask,
                                            naive_attention,
                                            online_softmax,
                                            online_softmax_stats,
                                            reference_attention,
                                            tiled_attention,
                                            tiled_attention_backward,
)
from common.kernels.attention.triton_backward import flash_attention_backward, flash_attn_func, sdpa
from common.kernels.attention.triton_forward import CPU_BLOCKS, flash_attention, launch_forward

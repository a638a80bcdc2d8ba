"""Low-precision number formats and block-scaled quantization, computed from the bit layouts. One namespace for the
labs (`from common.kernels import lowp`); behind it `formats` (bit layouts, rounding), `block_scaling` (quantizers and
schemes), `accuracy` (errors, realistic tensors, limited-precision accumulation) and `storage` (bytes per parameter,
what fits, critical batch).

Formats (`fp32`, `tf32`, `bf16`, `fp16`, `e4m3`, `e5m2`, `e2m1`) are `Format` objects built from (exponent bits,
mantissa bits, what the top exponent code means); largest value, smallest normal, epsilon and every representable
value follow from the layout. `round_to(x, fmt)` rounds to a format (round-to-nearest-even, saturating or not).

Quantizers (`quantize`, `dequantize`, presets in `SCHEMES`) split the last dimension -- the reduction dimension K of
a GEMM -- into blocks, give each block a scale, and round `x / scale` to the element format:
  fp8_tensor     E4M3, one FP32 scale for the tensor (amax / 448)
  fp8_1x128      E4M3, FP32 scale per 1x128 tile (DeepSeek-V3 activations)
  fp8_128x128    E4M3, FP32 scale per 128x128 block (DeepSeek-V3 weights)
  mxfp8, mxfp4   E4M3 / E2M1, 32-element blocks, power-of-two E8M0 scale 2^(floor(log2 amax) - emax_elem)
  nvfp4          E2M1, 16-element blocks, E4M3 block scale times one FP32 tensor scale amax / (6 * 448)
`accumulate` simulates a dot product summed in an accumulator with few significand bits, optionally promoted to FP32
every N elements (the DeepSeek-V3 fix for FP8 GEMMs on H800).

Sources (specification text, read 2026-12):
- OCP 8-bit Floating Point Specification (OFP8) rev 1.0, 2023 -- E4M3 (no Inf, max 448) and E5M2 (IEEE-like):
  https://www.opencompute.org/documents/ocp-8-bit-floating-point-specification-ofp8-revision-1-0-2023-12-01-pdf-1
- OCP Microscaling Formats (MX) Specification v1.0, Sept 2023 -- E2M1, E8M0, 32-element blocks, the shared scale
  2^(floor(log2(amax)) - emax_elem), saturating element conversion:
  https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf
- NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", June 2025 -- 16-element blocks,
  E4M3 block scale, FP32 tensor scale: https://developer.nvidia.com/blog/introducing-nvfp4-for-efficient-and-accurate-low-precision-inference/
- DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437, Dec 2024, Sec. 3.3 -- 1x128 / 128x128 FP8 tiles,
  accumulation on H800 limited to about 14 bits, promotion to FP32 every N_C = 128 elements:
  https://arxiv.org/abs/2412.19437
"""
from common.kernels.lowp.accuracy import (
                                          accumulate,
                                          make_activations,
                                          make_weights,
                                          quantized_gemm_error,
                                          rel_error,
                                          round_significand,
)
from common.kernels.lowp.block_scaling import (
                                          SCALE_KINDS,
                                          SCHEMES,
                                          Quantized,
                                          Scheme,
                                          blocks,
                                          check_finite,
                                          dequantize,
                                          fake_quantize,
                                          get_scheme,
                                          quantize,
                                          unblocks,
)
from common.kernels.lowp.formats import (
                                          E8M0_MAX_EXP,
                                          E8M0_MIN_EXP,
                                          FORMATS,
                                          Format,
                                          bf16,
                                          e2m1,
                                          e4m3,
                                          e5m2,
                                          fp16,
                                          fp32,
                                          get_format,
                                          is_power_of_two,
                                          round_to,
                                          tf32,
                                          torch_cast,
)
from common.kernels.lowp.storage import STORAGE, WEIGHT_FORMATS, bytes_per_param, critical_batch, max_params_billion

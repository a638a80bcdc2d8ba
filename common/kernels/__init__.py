"""What labs 02-05 teach about single kernels: the roofline, fusion and first Triton kernels (with the fused residual
add + RMSNorm, `rmsnorm`), FlashAttention (reference, tiled, Triton forward and backward, IO counts), low-precision
formats and FP8 GEMMs; and lab 14's MLA (three forms, `mla`) and its paged Triton decode kernel (`mla_decode`).

Imports `common.core` and `common.facts`; imported by moe, parallel, systems and the checkers.
"""

"""What labs 02-05 teach about single kernels: the roofline, fusion and first Triton kernels, FlashAttention (reference,
tiled, Triton forward and backward, IO counts), low-precision formats and FP8 GEMMs.

Imports `common.core` and `common.facts`; imported by moe, parallel, systems and the checkers.
"""

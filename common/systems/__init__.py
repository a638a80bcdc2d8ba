"""Whole systems (labs 09-13): rack topology, the arithmetic of scale and cost, the host side of a training loop,
device memory and the KV cache, GPU sharing, the profiling capstone and the DeepSeek-V3 step model.

May import every package above it (core, facts, kernels, moe, parallel); imported only by the checkers.
"""

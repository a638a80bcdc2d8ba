"""Whole systems (labs 09-14), a package per subject: `cluster` (rack topology, the arithmetic of scale and cost),
`host` (the host side of a training loop, device memory, GPU sharing), `storage` (reads, checkpoints, 3FS's scale),
`capstone` (the profiling loop of lab 12), `v3` (DeepSeek-V3's training step from first principles and its H800
trace) and `inference` (the KV cache, paged, serving with continuous batching, DeepSeek's inference service).

May import every package above it (core, facts, kernels, moe, parallel); imported only by the checkers.
"""

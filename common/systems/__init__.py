"""Whole systems (labs 09-14): rack topology, the arithmetic of scale and cost, the host side of a training loop,
device memory and the KV cache, GPU sharing, storage (`storage`: reads, checkpoints, 3FS's scale), the profiling
capstone and the DeepSeek-V3 step model; lab 14's paged KV cache (`paged_kv`, `kv_trace`), serving with continuous
batching (`serving`) and DeepSeek's inference service from first principles (`inference_model`, `service`).

May import every package above it (core, facts, kernels, moe, parallel); imported only by the checkers.
"""

"""Inference (lab 14): the KV cache's size (`kvcache`), a paged KV cache (`paged_kv`) and its traces (`kv_trace`),
serving with continuous batching (`serving`), DeepSeek's inference service modelled (`model`) and priced (`service`).
"""

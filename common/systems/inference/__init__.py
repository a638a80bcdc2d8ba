"""Inference (lab 14): the KV cache's size (`kvcache`), a paged KV cache (`paged_kv`) and its traces (`kv_trace`),
one step of a continuous-batching scheduler (`scheduler`), automatic prefix caching (`prefix_cache`), serving with
continuous batching (`serving`), DeepSeek's inference service modelled (`model`) and priced (`service`).
"""

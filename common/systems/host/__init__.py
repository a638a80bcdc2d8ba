"""The host side of a training loop (lab 11): CPU-side bottlenecks and placement (`hostside`), device memory and
fragmentation (`memory`), GPU sharing by time slicing, MIG and MPS (`sharing`).
"""

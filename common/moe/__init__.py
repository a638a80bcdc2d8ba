"""Mixture of experts (lab 06): DeepSeek-V3's gate, dispatch and combine, load balancing (`moe`), and EPLB's expert
placement (`eplb`).

Imports `common.core`, `common.facts` and `common.kernels`; imported by parallel, systems and the checkers.
"""

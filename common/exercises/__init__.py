"""Checkers, one module per lab (`lab00`, `lab01`, ...), one checker per exercise, named after it, and what they share
(`cases`: random cases, learner calls, watched references, streamed blocks; `blockwise`: lab 05's tensor checks;
`attention_checks`: lab 04's reference, diagnosis and tensor-operation guard; `simtime`: lab 01's simulated device
queue and clock), and `remote`: the kernel's side of the grader (a check cell asks the grader to judge it).

The top layer: may import every package of `common`; nothing in `common` imports it.
"""

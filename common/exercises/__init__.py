"""Checkers, one module per lab (`lab00`, `lab01`, ...), one checker per exercise, named after it, and what they share
(`cases`: random cases, learner calls, watched references).

The top layer: may import every package of `common`; nothing in `common` imports it.
"""

"""Checkers, one module per lab (`lab00`, `lab01`, ...), one checker per exercise, named after it."""

"""Work over several ranks (labs 07-08): the process launcher, collectives and their cost model, expert-parallel
dispatch on real ranks, pipeline schedules (simulated and executed), compute/communication overlap and DDP.

Imports `common.core`, `common.facts`, `common.kernels` and `common.moe`; imported by systems and the checkers.
"""

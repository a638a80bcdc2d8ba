"""Facts with their sources, read from `data/`: hardware datasheets (`hardware`), model configs (`models`) and
fact files of facts with sources (`sourced`).

Imports `common.core` only; the lab packages (kernels, moe, parallel, systems) and the checkers import it.
"""

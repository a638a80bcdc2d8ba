"""Facts with their sources, read from `data/`: hardware datasheets (`hardware`) and model configs (`models`).

Imports `common.core` only; the lab packages (kernels, moe, parallel, systems) and the checkers import it.
"""

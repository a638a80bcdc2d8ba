"""The workbook's own machinery: environment and profiles, timing and measurement, this machine's ceilings and its
probe, exercise verdicts, the results ledger, baselines and the rule that judges a run (baseline), the machine
around a notebook (watch), the labs generator, the notebook runner and its report, plots and widgets, grading, the
sandboxes' bubblewrap and cgroups (bwrap), the class hub (hub/) and trace reading.

Imports nothing else of `common`; every other package may import it.
"""

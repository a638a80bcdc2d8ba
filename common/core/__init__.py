"""The workbook's own machinery: environment and profiles, timing and measurement, this machine's ceilings, exercise
verdicts, the results ledger, plots and widgets, the labs generator, the notebook runner, grading and trace reading.

Imports nothing else of `common`; every other package may import it.
"""

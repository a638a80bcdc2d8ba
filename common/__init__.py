"""The workbook's helper package. Start every notebook with `from common import setup; env = setup("NN_name", PROFILE)`.

Modules, one job each: env (profile, device, Triton mode, inventory), timing (bench, compare), checks (exercise
verdicts), results (the ledger), plots (house style), widgets (interactive or static), notebooks (labs generator),
runner (papermill runs and the report). Lab-specific modules (roofline, hardware, moe, ...) sit beside them.
"""
from common.env import setup

__all__ = ["setup"]

"""Sharing one GPU: MIG profiles (from data/mig_profiles.json) and a utilisation model of time slicing, MIG and MPS.

Model: a job alone on a full GPU keeps a fraction `demand` of its compute busy (a small-batch inference server might
use 10%). Time slicing runs one context at a time, so utilisation stays at `demand`. MIG gives each job a hard slice
of 1/7 of the SMs (at most 7 instances): a job gets min(demand, slice). MPS lets kernels of several processes share the
SMs: the jobs' demands add up, capped at the whole GPU. Tightly coupled training is the opposite case: every rank
waits for the slowest at each step, so slicing a GPU only slows each rank, and MIG instances cannot talk over NVLink
peer-to-peer (MIG user guide, "Application Considerations").
"""
from __future__ import annotations

import json
from fractions import Fraction

from common.core.env import REPO_ROOT

MODES = ("time-slicing", "mig", "mps")


def mig_profiles(gpu_id: str) -> list[dict]:
    data = json.loads((REPO_ROOT / "data" / "mig_profiles.json").read_text())
    if gpu_id not in data["gpus"]:
        raise ValueError(f"gpu_id={gpu_id!r} has no MIG profiles in data/mig_profiles.json; known: "
                         f"{', '.join(data['gpus'])}")
    return [{**p, "sm_fraction": float(Fraction(p["sm_fraction"])),
             "memory_fraction": float(Fraction(p["memory_fraction"]))} for p in data["gpus"][gpu_id]]


def shared_utilisation(demand: float, n_jobs: int, mode: str, slices: int = 7) -> float:
    """Fraction of the GPU's compute kept busy by n_jobs identical jobs of the given demand."""
    if not 0 < demand <= 1:
        raise ValueError(f"demand={demand!r} must be in (0, 1]")
    if n_jobs < 1:
        raise ValueError(f"n_jobs={n_jobs!r} must be >= 1")
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; allowed: {', '.join(MODES)}")
    if mode == "time-slicing":
        return demand
    if mode == "mig":
        return min(n_jobs, slices) * min(demand, 1 / slices)
    return min(1.0, n_jobs * demand)


def coupled_step_time(compute_s: float, comm_s: float, sm_fraction: float, comm_slowdown: float = 1.0) -> float:
    """Step time of a synchronous data-parallel rank given a fraction of a GPU: compute stretches by 1/sm_fraction,
    communication by `comm_slowdown` (e.g. staging through host memory when NVLink P2P is unavailable)."""
    if compute_s < 0 or comm_s < 0 or not 0 < sm_fraction <= 1 or comm_slowdown < 1:
        raise ValueError(f"compute_s={compute_s}, comm_s={comm_s} >= 0, sm_fraction={sm_fraction} in (0, 1], "
                         f"comm_slowdown={comm_slowdown} >= 1 required")
    return compute_s / sm_fraction + comm_s * comm_slowdown

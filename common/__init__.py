"""The workbook's helper package. Start every notebook with `from common import setup; env = setup("NN_name", PROFILE)`.

Packages by concern, imports pointing down this list (tests/test_layout.py enforces it):
- core: the workbook's machinery (env, timing, measurement, ceilings, checks, results, plots, widgets, notebooks,
  runner, grading, traces);
- facts: data/ read with sources (hardware, models, fact files);
- kernels: roofline, fusion, attention, low precision (labs 02-05), MLA and its decode kernel (lab 14);
- moe: routing, dispatch, load balancing, EPLB (lab 06);
- parallel: launcher, collectives, expert parallelism, pipelines, overlap, DDP (labs 07-08);
- systems: topology, scale and cost, host side, memory, KV cache, sharing, capstone, the V3 model (labs 09-13),
  paged KV cache, serving and the inference service model (lab 14);
- exercises: one checker module per lab (the top layer).
"""
from common.core.env import setup

__all__ = ["setup"]

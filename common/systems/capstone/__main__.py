"""`python -m common.systems.capstone --version kept --steps 5`: run steps of the block for nsys / ncu on a GPU.

`--version kept` runs the version lab 12's guard kept (written by the lab to `build/capstone/kept_version.json`;
`--kept PATH` to read another), `baseline` the naive one, `all` every candidate applied. On a GPU each step is an
NVTX range ("step 0", ...) and, under `torch.autograd.profiler.emit_nvtx`, every operator and every
`record_function` range of the block (norm, mla_proj, attention_core, gate, routed_experts, shared_expert) is one
too -- the ranges `nsys profile --trace=cuda,nvtx` shows above the kernels. (`record_function` alone reaches only
torch.profiler, not NVTX.)
"""
from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import torch

from common.core.env import REPO_ROOT
from common.systems.capstone.block import Block, make_input, step
from common.systems.capstone.config import BASELINE, all_applied, config_for, from_dict

KEPT = REPO_ROOT / "build" / "capstone" / "kept_version.json"


def version_named(name: str, kept: Path = KEPT):
    if name == "baseline":
        return BASELINE
    if name == "all":
        return all_applied()
    if not Path(kept).is_file():
        raise SystemExit(f"{kept} is missing: run lab 12 (its guard writes the kept version there), or pass "
                         f"--version baseline / all")
    return from_dict(json.loads(Path(kept).read_text()))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--version", choices=["kept", "baseline", "all"], default="kept")
    ap.add_argument("--kept", type=Path, default=KEPT, help="the kept version's file (lab 12 writes it)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--profile", choices=["quick", "full"], default="full")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    block = Block(config_for(args.profile), device=device)
    x = make_input(block.cfg, device=device)
    version = version_named(args.version, args.kept)
    cuda = device == "cuda"
    ranges = torch.autograd.profiler.emit_nvtx() if cuda else contextlib.nullcontext()
    with ranges:
        for i in range(args.steps):
            with torch.cuda.nvtx.range(f"step {i}") if cuda else contextlib.nullcontext():
                step(block, x, version)
                if cuda:
                    torch.cuda.synchronize()
    print(f"ran {args.steps} steps of {version.name} ({version}) on {device}")


if __name__ == "__main__":
    main()

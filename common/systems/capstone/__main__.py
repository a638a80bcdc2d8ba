"""`python -m common.systems.capstone --version final --steps 5`: run steps of the block (for nsys / ncu on a GPU);
"final" is every candidate applied."""
from __future__ import annotations

import argparse

import torch

from common.systems.capstone.block import Block, make_input, step
from common.systems.capstone.config import BASELINE, all_applied, config_for


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--version", choices=["baseline", "final"], default="final")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--profile", choices=["quick", "full"], default="full")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    block = Block(config_for(args.profile), device=device)
    x = make_input(block.cfg, device=device)
    version = BASELINE if args.version == "baseline" else all_applied()
    for i in range(args.steps):
        if device == "cuda":
            torch.cuda.nvtx.range_push(f"step {i}")
        step(block, x, version)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
    print(f"ran {args.steps} steps of {version.name} on {device}")


if __name__ == "__main__":
    main()

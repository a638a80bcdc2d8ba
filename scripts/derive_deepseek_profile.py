"""Derive data/deepseek_profile_train.json from DeepSeek's trace train.json (figures only, never the trace).

    python scripts/derive_deepseek_profile.py PATH/TO/train.json [OUT.json]

train.json is in the public repository deepseek-ai/profile-data (commit 4496024); it has no licence file, so the
workbook ships what this script derives from it -- phase, stream and kernel-class durations, overlap -- with the
repository, commit and file as source, not the file itself.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.systems.v3 import trace as deepseek_trace  # noqa: E402


def main(argv) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = Path(argv[2]) if len(argv) == 3 else deepseek_trace.PROFILE_PATH
    figures = deepseek_trace.summarize(argv[1])
    out.write_text(json.dumps(figures, indent=1) + "\n")
    s = figures["step"]
    print(f"wrote {out}: step {s['gpu_ms']:.1f} ms on the GPU ({s['host_ms']:.1f} ms host range), "
          f"{s['kernels']} kernels, {len(figures['phases'])} phases")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

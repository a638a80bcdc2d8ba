"""scripts/gpu_check.sh: the dry run lists every step, within the 8.75-minute budget, and finds every file it needs."""
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_dry_run(tmp_path):
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path)}
    r = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    steps = re.findall(r"\[dry-run\] (.+?) \(timeout (\d+)s\)", r.stdout)
    names = [s[0] for s in steps]
    assert any("attention benchmark" in n for n in names) and any("PROFILE=full" in n for n in names)
    assert any("profiler recipe" in n for n in names)
    assert any("MLA decode benchmark" in n for n in names) and "benchmarks/mla_decode_bench.py" in r.stdout
    assert "--labs 00 01 02 03 04 05" in r.stdout
    if (ROOT / "benchmarks" / "lowp_bench.py").exists():
        assert f"lowp_bench.py --out {tmp_path}" in r.stdout
    assert sum(int(s[1]) for s in steps) <= 525, steps

"""The torchrun entry points: each runs under `torchrun --standalone --nproc-per-node 2` with gloo (torch's own
launcher, `python -m torch.distributed.run`) and writes the ledger names its lab writes. All four run in the ranks of
one launch, one after another, each as `-m` runs it (tests/torchrun_entry_points.py): a launch is three torch imports."""
import json
import os
import signal
import subprocess
import sys

import pytest

from common.core.env import REPO_ROOT

ENTRY_POINTS = {
    "common.parallel.collectives": (["--max-bytes", str(2**22), "--repeats", "3"],  # 4 MiB: a slope to fit
                                    {"collectives.fit.alpha_us", "collectives.fit.beta_gbps"}),
    "common.parallel.expert_parallel": (["--tokens-per-rank", "64", "--hidden", "128", "--num-experts", "16",
                                         "--top-k", "4", "--repeats", "1", "--ranks-per-node", "1"],
                                        {"ep.dispatch.max_abs_err", "ep.exchange.bytes_ratio",
                                         "ep.dedup.bytes_saving"}),
    "common.parallel.pipeline_run": (["--hidden", "32", "--repeats", "1"],
                                     {"pp.real.grad_max_err", "pp.real.bubble_ratio"}),
    "common.parallel.ddp_overlap": (["--layers", "2", "--hidden", "64", "--batch", "8", "--repeats", "2"],
                                    {"ddp.overlap.speedup", "ddp.overlap.ideal"}),
}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One torchrun launch (2 gloo ranks) that runs every entry point in turn, as `-m` runs it
    (tests/torchrun_entry_points.py): each module's ledger in its own file."""
    ledgers = tmp_path_factory.mktemp("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    groups = [[module, "--backend", "gloo", *ENTRY_POINTS[module][0]] for module in sorted(ENTRY_POINTS)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(REPO_ROOT / "tests" / "torchrun_entry_points.py"), str(ledgers), *groups[0]]
    for group in groups[1:]:
        cmd += ["--", *group]
    # its own session, so that a timeout kills the ranks too (killing the launcher alone left them running)
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += "\n(killed after 300 s)"
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), ledgers, " ".join(cmd)


@pytest.mark.parametrize("module", sorted(ENTRY_POINTS))
def test_entry_point_under_torchrun(module, launched):
    proc, ledgers, cmd = launched
    ledger = ledgers / f"{module}.jsonl"
    assert ledger.exists(), f"{module} wrote no ledger\n{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    records = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert {r["name"] for r in records} == ENTRY_POINTS[module][1]
    assert all(r["lab"] in ("07_collectives", "08_pipeline_dualpipe") for r in records)
    assert f"=== {module} on rank 1" in proc.stdout, f"{module} did not run on rank 1\n{proc.stdout[-3000:]}"


def test_the_launch_exits_cleanly(launched):
    proc, _, cmd = launched
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_help_of_every_entry_point_names_its_backend_option():
    # `python -m <module> --help` for each, in one process (runpy is what -m runs): one interpreter's start, not four
    code = ("import runpy, sys\nfor m in sys.argv[1:]:\n    sys.argv = [m, '--help']\n    try:\n"
            "        runpy.run_module(m, run_name='__main__', alter_sys=True)\n    except SystemExit as e:\n"
            "        print(f'=== {m} exited with {e.code}', flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code, *ENTRY_POINTS], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    parts = out.stdout.split("=== ")
    for module, text in zip(ENTRY_POINTS, parts):
        assert "--backend" in text and "torchrun" in text, (module, text[-500:])
    assert [p.split("\n")[0] for p in parts[1:]] == [f"{m} exited with 0" for m in ENTRY_POINTS], out.stdout[-2000:]

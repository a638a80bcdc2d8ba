"""The torchrun entry points across two machines, tried on one: two torchrun agents on 127.0.0.1 (`--nnodes 2
--rdzv-backend c10d`, one gloo rank each, a rendezvous id of their own) run every entry point, one after another in
the ranks of one launch (tests/torchrun_entry_points.py: a launch is four torch imports), each as `-m` runs it: each
writes the ledger names its lab writes, on rank 0 only, and says where; `--help` is printed once, by rank 0, under the
module's name. Everything the launch writes in a temporary directory lands in the test's own (TMPDIR)."""
import json
import os
import signal
import socket
import subprocess
import sys
import uuid

import pytest

from common.core.env import REPO_ROOT

ENTRY_POINTS = {
    "common.parallel.collectives": (["--max-bytes", str(2**22), "--repeats", "3"],  # 4 MiB: a slope to fit
                                    {"collectives.fit.alpha_us", "collectives.fit.beta_gbps"}),
    "common.parallel.expert_parallel": (["--tokens-per-rank", "64", "--hidden", "128", "--num-experts", "16",
                                         "--top-k", "4", "--repeats", "1"],
                                        {"ep.dispatch.max_abs_err", "ep.exchange.bytes_ratio",
                                         "ep.dedup.bytes_saving"}),
    "common.parallel.pipeline_run": (["--hidden", "32", "--repeats", "1"],
                                     {"pp.real.grad_max_err", "pp.real.bubble_ratio"}),
    "common.parallel.ddp_overlap": (["--layers", "2", "--hidden", "64", "--batch", "8", "--repeats", "2",
                                     "--runs", "2"],
                                    {"ddp.overlap.speedup", "ddp.overlap.ideal", "ddp.hooks.buckets", "ddp.ddp.buckets"}),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Two torchrun agents (--nnodes 2, c10d rendezvous on 127.0.0.1, one gloo rank each) that run every entry
    point's --help, then every entry point in turn: each module's ledger in its own file."""
    tmp = tmp_path_factory.mktemp("torchrun")
    ledgers, scratch = tmp / "ledgers", tmp / "tmp"
    ledgers.mkdir(), scratch.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch)}
    groups = [[m, "--help"] for m in sorted(ENTRY_POINTS)]
    groups += [[module, "--backend", "gloo", *ENTRY_POINTS[module][0]] for module in sorted(ENTRY_POINTS)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
           "--rdzv-id", f"test-{uuid.uuid4().hex[:12]}",
           str(REPO_ROOT / "tests" / "torchrun_entry_points.py"), str(ledgers), *groups[0]]
    for group in groups[1:]:
        cmd += ["--", *group]
    # each agent in its own session, so that a timeout kills its rank too (killing the launcher alone left it)
    agents = [subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True) for _ in range(2)]
    done = []
    for proc in agents:
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for p in agents:
                os.killpg(p.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += "\n(killed after 300 s)"
        done.append(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
    return done, ledgers, scratch, " ".join(cmd)


def _text(done) -> str:
    return "\n".join(p.stdout + p.stderr for p in done)


@pytest.mark.parametrize("module", sorted(ENTRY_POINTS))
def test_entry_point_across_two_agents(module, launched):
    done, ledgers, _, cmd = launched
    ledger = ledgers / f"{module}.jsonl"
    assert ledger.exists(), f"{module} wrote no ledger\n{cmd}\n{_text(done)[-4000:]}"
    records = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert {r["name"] for r in records} == ENTRY_POINTS[module][1], "written once, by rank 0 only"
    assert len(records) == len(ENTRY_POINTS[module][1])
    assert all(r["lab"] in ("07_collectives", "08_pipeline_dualpipe") for r in records)
    text = _text(done)
    assert f"=== {module} on rank 1" in text and f"=== {module} on rank 0" in text, text[-3000:]
    assert f"results of rank 0 written to {ledger} on " in text


def test_help_once_on_rank_zero_under_the_module_name(launched):
    done, *_ = launched
    text = _text(done)
    for module in ENTRY_POINTS:
        usage = f"usage: torchrun [--nnodes N --nproc-per-node G ...] -m {module}"
        assert text.count(usage) == 1, (module, text.count(usage))
        assert f"=== {module} exited with 0 on rank 0" in text and f"=== {module} exited with 0 on rank 1" in text
    assert text.count("--backend {gloo,nccl}") >= len(ENTRY_POINTS)


def test_the_two_agents_exit_cleanly_and_leave_their_files_in_tmpdir(launched):
    done, _, scratch, cmd = launched
    assert [p.returncode for p in done] == [0, 0], f"{cmd}\n{_text(done)[-4000:]}"
    assert any(p.name.startswith("torchelastic_") for p in scratch.iterdir()), "torchrun's logs went elsewhere"

"""Run several of the workbook's torchrun entry points, one after another, in the ranks of ONE torchrun launch:

    torchrun [--standalone | --nnodes N --rdzv-backend c10d ...] --nproc-per-node G tests/torchrun_entry_points.py \
        LEDGER_DIR MODULE ARG... -- MODULE ARG...

Each module runs as `python -m MODULE ARG...` would run it (`runpy.run_module(..., alter_sys=True)`, which is what
-m does), with its ledger in LEDGER_DIR/MODULE.jsonl; a module that exits (`--help`) is reported and the next runs. Its `main` joins the group torchrun describes (env://) and
destroys it at the end. The first module joins through torchrun's own store, as a lone entry point does. A second
group on that store would find the first one's keys (the default group is named "0" again after a destroy, so gloo's
rendezvous read stale addresses: seen as a hang); so each later module gets a store of its own that rank 0 hosts on
a fresh port (MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=False: the env:// path of a launch without torchrun's agent
store), the port passed to the other ranks through torchrun's store.

One launch, not four: each launch costs three torch imports (the launcher and two ranks), about 9 CPU-s on a 2-core
Zen 1, more than the entry points' own work at the tests' sizes.
"""
import os
import runpy
import socket
import sys
from datetime import timedelta


def _groups(argv):
    group = []
    for a in argv:
        if a == "--":
            yield group
            group = []
        else:
            group.append(a)
    if group:
        yield group


def _fresh_store(i: int, agent_port: int) -> None:
    """Point env:// at a new store for module number i (> 0): rank 0 picks a free port and hosts it; the port goes
    to the other ranks through torchrun's store at `agent_port`."""
    import torch.distributed as dist
    agent = dist.TCPStore(os.environ["MASTER_ADDR"], agent_port, is_master=False,
                          timeout=timedelta(seconds=60))
    if os.environ["RANK"] == "0":
        with socket.socket() as s:
            s.bind((os.environ["MASTER_ADDR"], 0))
            agent.set(f"entry_points/{i}", str(s.getsockname()[1]))
    os.environ.update(MASTER_PORT=agent.get(f"entry_points/{i}").decode(), TORCHELASTIC_USE_AGENT_STORE="False")


def main() -> None:
    ledger_dir, rest = sys.argv[1], sys.argv[2:]
    agent_port = int(os.environ["MASTER_PORT"])
    joined = 0
    for module, *args in _groups(rest):
        if "--help" not in args:
            if joined:
                _fresh_store(joined, agent_port)
            joined += 1
        os.environ["WORKBOOK_RESULTS"] = os.path.join(ledger_dir, module + ".jsonl")
        print(f"=== {module} on rank {os.environ.get('RANK')}", flush=True)
        sys.argv = [module, *args]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exc:  # --help: it parsed its arguments and left before joining a group
            print(f"=== {module} exited with {exc.code} on rank {os.environ.get('RANK')}", flush=True)


if __name__ == "__main__":
    main()

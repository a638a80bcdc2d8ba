"""A training state in DeepSeek's recipe, compared bit for bit, and `torch.distributed.checkpoint` (DCP) sharded over
gloo ranks with `async_save` overlapping training steps (lab 11 runs it in the full profile; a trainer's own
checkpoints, serialised, written durably and in the background, are `writer`'s).

What is measured:
- `async_checkpoint_worker` (run by `measure_async_checkpoint` through `common.parallel.distributed.run_workers`):
  each rank holds its shard of a model (DTensors sharded on dim 0) in DeepSeek's recipe -- BF16 weights, FP32 master
  weights, BF16 AdamW moments (lab 09) -- and trains (`_train_step`: the accelerator's time, during which the host
  waits, then a gradient all-reduce over the default group and an in-place change of every tensor). Per round,
  interleaved: a blocking `dcp.save` (t_save), the steps alone (t_steps), and `dcp.async_save` followed by the same
  steps and a wait for the write (t_overlap). The write's exposed cost is t_overlap - t_steps; its hidden fraction
  is 1 - exposed / t_save, clipped to [0, 1]. DCP's collectives run on a separate gloo group, so they never
  interleave with training's.
- Read back: the last round's checkpoints are loaded into fresh tensors and compared bit for bit with a copy taken
  when each save began; the steps that ran during the asynchronous write changed every tensor (checked), so it
  also shows that DCP staged the state before training moved on.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import torch

from common.core.validate import number, whole
from common.systems.storage.files import MIB, Scratch

RECIPE = (("weight", torch.bfloat16), ("master", torch.float32), ("exp_avg", torch.bfloat16),
          ("exp_avg_sq", torch.bfloat16))  # 2 + 4 + 2 + 2 = 10 bytes per parameter
BYTES_PER_PARAM = sum(torch.empty(0, dtype=d).element_size() for _, d in RECIPE)


def state_bytes(state: dict) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in state.values())


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def recipe_state(params: int, seed: int = 0, width: int = 1024, prefix: str = "") -> dict:
    """A training state of about `params` parameters (rounded down to whole rows) in up to 4 layers of `width`
    columns: per layer the BF16 weight, the FP32 master and the two BF16 AdamW moments (10 bytes per parameter),
    seeded normal values (the second moment positive)."""
    whole("params", params, width, meaning=f"at least one row of width={width}")
    g = torch.Generator().manual_seed(seed)
    rows, out = params // width, {}
    for layer, n in enumerate(_split(rows, 4)):
        master = torch.randn(n, width, generator=g)
        for name, dtype in RECIPE:
            value = master if name == "master" else (master * (1.0 if name == "weight" else 1e-3)).to(dtype)
            out[f"{prefix}layer{layer}.{name}"] = value.abs() if name == "exp_avg_sq" else value
    return out


def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (i < n % parts) for i in range(parts) if n // parts + (i < n % parts)]


def bitwise_mismatches(got: dict, want: dict) -> list[str]:
    """The keys whose tensors differ from `want` in any bit (or in dtype, shape, or presence)."""
    bad = [k for k in want if k not in got] + [k for k in got if k not in want]
    for k in want:
        if k not in got:
            continue
        a, b = _local(got[k]), _local(want[k])
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(
                a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)):
            bad.append(k)
    return bad


# ---------------------------------------------------------------- DCP on gloo ranks

def _train_step(state: dict, bucket: torch.Tensor, device_s: float, group=None) -> None:
    """One training step as the host sees it: the accelerator's forward, backward and optimizer step, during which the
    host thread only waits (`device_s` of sleep stands for them, as section 1's loader does); then a real all-reduce
    of one 1 MiB gradient bucket over gloo, and an in-place change of every tensor of the state (weight decay on the
    FP32 master and the moments, the BF16 weights copied from the master, the bucket's gradient applied) -- so a
    checkpoint that had not been staged before the step would see new values."""
    import torch.distributed as dist
    time.sleep(device_s)
    g = bucket.clone()
    dist.all_reduce(g, group=group)
    for key in [k for k in state if k.endswith(".master")]:
        layer = key[: -len("master")]
        master = _local(state[key])
        flat = master.mul_(1 - 1e-3).view(-1)
        k = min(flat.numel(), g.numel())
        flat[:k].add_(g[:k], alpha=-1e-3 / dist.get_world_size(group))
        _local(state[layer + "weight"]).copy_(master)
        _local(state[layer + "exp_avg"]).mul_(0.9)
        _local(state[layer + "exp_avg_sq"]).mul_(0.99)  # a BF16 ulp is 2^-8: 0.999 would change nothing


def async_checkpoint_worker(rank: int, world_size: int, directory: str, params_per_rank: int, rounds: int,
                            device_s: float, seed: int = 0) -> dict:
    """Measure blocking dcp.save, training steps alone and dcp.async_save overlapped with the same steps (see the
    module docstring); load the last round's two checkpoints back and compare them bit for bit. Runs in every rank."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world_size,))
    ckpt_group = dist.new_group(backend="gloo")
    local = recipe_state(params_per_rank, seed + rank)
    state = {k: DTensor.from_local(v, mesh, [Shard(0)], run_check=False) for k, v in local.items()}
    g = torch.Generator().manual_seed(seed + 100 + rank)
    bucket = torch.randn(MIB // 4, generator=g)  # one 1 MiB FP32 gradient bucket
    phases = {"start": time.perf_counter()}

    def steps(n):
        for _ in range(n):
            _train_step(state, bucket, device_s)

    def wait(response):
        fut = getattr(response, "upload_completion", response)
        fut.result()

    def check(path, snapshot):
        target = {k: DTensor.from_local(torch.full_like(v.to_local(), -7), mesh, [Shard(0)], run_check=False)
                  for k, v in state.items()}
        dcp.load(target, checkpoint_id=path, process_group=ckpt_group)
        return bitwise_mismatches(target, snapshot)

    def remove(path):
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        dist.barrier()

    # warm-up: one async_save (its first call starts the writer thread and caches plans) and two steps; then enough
    # steps per overlap to cover about 1.5 times the warm-up save
    dist.barrier()
    t = time.perf_counter()
    wait(dcp.async_save(state, checkpoint_id=os.path.join(directory, "warmup"), process_group=ckpt_group))
    t_save0 = time.perf_counter() - t
    files = {f: os.path.getsize(os.path.join(directory, "warmup", f))
             for f in os.listdir(os.path.join(directory, "warmup"))}
    remove(os.path.join(directory, "warmup"))
    t = time.perf_counter()
    steps(2)
    step_s = (time.perf_counter() - t) / 2
    t_step = torch.tensor([step_s, t_save0], dtype=torch.float64)
    dist.all_reduce(t_step, op=dist.ReduceOp.MAX)
    n_steps = int(min(200, max(3, round(1.5 * t_step[1].item() / t_step[0].item()))))
    phases["calibrated"] = time.perf_counter()
    out = {"rank": rank, "shard_bytes": state_bytes(state), "files": files, "n_steps": n_steps, "step_s": step_s,
           "t_save": [], "t_steps": [], "t_overlap": [], "t_block": [], "t_wait": [], "t_write": [],
           "mismatches": []}
    for i in range(rounds):
        last = i == rounds - 1
        path = os.path.join(directory, f"sync{i}")
        snapshot = {k: v.to_local().clone() for k, v in state.items()} if last else None
        dist.barrier()
        t = time.perf_counter()
        dcp.save(state, checkpoint_id=path, process_group=ckpt_group)
        out["t_save"].append(time.perf_counter() - t)
        if last:
            out["mismatches"] += check(path, snapshot)
        remove(path)

        dist.barrier()
        t = time.perf_counter()
        steps(n_steps)
        out["t_steps"].append(time.perf_counter() - t)

        path = os.path.join(directory, f"async{i}")
        snapshot = {k: v.to_local().clone() for k, v in state.items()} if last else None
        finished = []
        dist.barrier()
        t = time.perf_counter()
        response = dcp.async_save(state, checkpoint_id=path, process_group=ckpt_group)
        out["t_block"].append(time.perf_counter() - t)
        getattr(response, "upload_completion", response).add_done_callback(
            lambda _: finished.append(time.perf_counter()))
        steps(n_steps)  # these steps change the weights while the checkpoint is written
        waited = time.perf_counter()
        wait(response)
        end = time.perf_counter()
        out["t_overlap"].append(end - t)
        out["t_wait"].append(end - waited)
        out["t_write"].append((finished[0] if finished else end) - t)
        if last:
            out["mismatches"] += check(path, snapshot)
            # the steps during the write must have changed every tensor, or the bit-for-bit check proves nothing
            out["changed_during_write"] = len(bitwise_mismatches({k: v.to_local() for k, v in state.items()},
                                                                 snapshot)) == len(state)
        remove(path)
    phases["done"] = time.perf_counter()
    out["phases"] = {k: v - phases["start"] for k, v in phases.items()}
    return out


def hidden_fraction(t_save: float, t_steps: float, t_overlap: float) -> float:
    """The share of a checkpoint write that training hid: 1 - (t_overlap - t_steps) / t_save, clipped to [0, 1]."""
    if not t_save > 0:
        raise ValueError(f"t_save={t_save!r} must be > 0")
    return min(1.0, max(0.0, 1 - (t_overlap - t_steps) / t_save))


# what async_checkpoint_worker imports in each rank (DTensor's first call imports torch._dynamo): about 3 s of CPU per
# rank on a 2-core Zen 1, paid once in the fork server instead
RANK_MODULES = ("torch.distributed.checkpoint", "torch.distributed.tensor", "torch._dynamo", __name__)


def start_checkpoint_ranks() -> bool:
    """Start the fork server of `measure_async_checkpoint`'s ranks now, in the background, with DCP imported (see
    common.parallel.distributed.start_rank_server); False if a fork server already runs."""
    from common.parallel.distributed import start_rank_server
    return start_rank_server(*RANK_MODULES)


def measure_async_checkpoint(scratch: Scratch, params_per_rank: int, rounds: int = 3, ranks: int = 2,
                             device_ms: float = 40.0, timeout: float = 120) -> dict:
    """Run async_checkpoint_worker on `ranks` gloo ranks (common.parallel.distributed.run_workers) writing into the
    scratch directory. Per round the slowest rank's times count (every rank waits for it); returns the rounds, the
    hidden fraction of each, their median and every rank's bit-for-bit verdict."""
    from common.parallel.distributed import run_workers
    whole("params_per_rank", params_per_rank, 1024, meaning="at least one row of 1024 columns")
    whole("rounds", rounds)
    whole("ranks", ranks)
    number("device_ms", device_ms, strict=False, meaning="milliseconds the accelerator takes per step")
    shard = params_per_rank * BYTES_PER_PARAM
    scratch.reserve(ranks * shard + MIB, "distributed checkpoints")  # each round's checkpoint is removed after it
    directory = tempfile.mkdtemp(prefix="dcp-", dir=scratch.path)
    start_checkpoint_ranks()  # unless one runs already: DCP imported once, not in every rank
    per_rank = run_workers(async_checkpoint_worker, ranks,
                           args=(directory, params_per_rank, rounds, device_ms / 1e3), backend="gloo",
                           timeout=timeout)
    rows = []
    for i in range(rounds):
        t = {k: max(r[k][i] for r in per_rank) for k in ("t_save", "t_steps", "t_overlap", "t_block", "t_wait",
                                                         "t_write")}
        t["hidden_fraction"] = hidden_fraction(t["t_save"], t["t_steps"], t["t_overlap"])
        rows.append(t)
    total = sum(r["shard_bytes"] for r in per_rank)
    return {"rounds": rows, "hidden_fraction": statistics.median(r["hidden_fraction"] for r in rows),
            "checkpoint_bytes": total, "files": per_rank[0]["files"], "n_steps": per_rank[0]["n_steps"],
            "save_gbps": total / statistics.median(r["t_save"] for r in rows) / 1e9,
            "mismatches": {r["rank"]: r["mismatches"] for r in per_rank},
            "changed_during_write": all(r["changed_during_write"] for r in per_rank), "phases": per_rank[0]["phases"]}

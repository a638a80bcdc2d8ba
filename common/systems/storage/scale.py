"""From one machine's disk to 3FS's scale: per-node throughput against NIC line rate, the seconds a DeepSeek-V3
checkpoint takes, whether reading tokens can bound pre-training, and what DeepSeek's on-disk KV cache reads and saves.

3FS's figures come from data/storage_3fs.json (deepseek-ai/3FS README at commit e2cef82: `fact`, `source`); the
KVCache peak and DeepSeek's service figures (deepseek-ai/open-infra-index day 6 at commit 56d8685) from lab 14's
data/deepseek_v3_service.json (`inference_model.fact`). Everything else is derived by the labs' own helpers: the
checkpoint's bytes by lab 09/13's memory recipe (`topology.memory_per_gpu_gb` over `v3model.sketch()` with the run's
bytes per parameter), the KV bytes per token by lab 11's sizing (`kvcache.deepseek_v3_kv`), the training token rate
by data/deepseek_v3_run.json. Units: bytes, seconds; GB = 1e9 B, TiB = 2^40 B, GiB = 2^30 B, Gbps = 1e9 bit/s.
"""
from __future__ import annotations

from common.core.env import REPO_ROOT
from common.core.validate import number, whole
from common.facts import hardware, models, sourced
from common.systems.cluster import topology
from common.systems.inference import kvcache, model as inference_model
from common.systems.v3 import model as v3model
from common.systems.inference import service as service_day
from common.systems.storage.files import GIB

FACTS_PATH = REPO_ROOT / "data" / "storage_3fs.json"
TIB, GB = float(1 << 40), 1e9
SECONDS_PER_DAY = 86_400.0
_FACTS = sourced.FactFile(FACTS_PATH)
fact = _FACTS.fact      # a published 3FS figure, e.g. fact("read_aggregate_tib_s") -> 6.6
source = _FACTS.source  # where it comes from: title, URL, commit and date
service = inference_model.fact  # DeepSeek's service figures (lab 14), e.g. service("nodes_average") -> 226.75


def gbps_to_bytes(gbps: float) -> float:
    """A line rate in Gbps (1e9 bits/s, as NICs are sold) in bytes/s."""
    return float(gbps) * 1e9 / 8


# ---------------------------------------------------------------- 3FS's published figures, checked

def read_per_node() -> dict:
    """The read stress test per storage node and per SSD, against the NICs' line rate and the clients' NICs."""
    aggregate = fact("read_aggregate_tib_s") * TIB
    nodes = fact("read_storage_nodes")
    line = fact("read_nics_per_node") * gbps_to_bytes(fact("read_nic_gbps"))
    clients = fact("read_client_nodes") * gbps_to_bytes(fact("read_client_nic_gbps"))
    per_node = aggregate / nodes
    return {"aggregate_bytes_s": aggregate, "per_node_bytes_s": per_node, "line_rate_bytes_s": line,
            "fraction_of_line_rate": per_node / line,
            "per_ssd_bytes_s": per_node / fact("read_ssds_per_node"),
            "client_line_rate_bytes_s": clients, "fraction_of_client_line_rate": aggregate / clients,
            "capacity_bytes": nodes * fact("read_ssds_per_node") * fact("read_ssd_tib") * TIB}


def graysort() -> dict:
    """GraySort: the published TiB/min recomputed from the size and the time, and per storage node."""
    tib_per_min = fact("graysort_tib") / (fact("graysort_seconds") / 60)
    rate = fact("graysort_tib") * TIB / fact("graysort_seconds")
    return {"tib_per_min": tib_per_min, "published_tib_per_min": fact("graysort_tib_per_min"),
            "bytes_s": rate, "per_storage_node_bytes_s": rate / fact("graysort_storage_nodes")}


def kvcache_peak_per_client() -> dict:
    """The KVCache peak against one client's 400 Gbps NIC (the README's figure read per client node)."""
    peak = service("threefs_kvcache_read_gibs") * GIB
    nic = gbps_to_bytes(fact("kvcache_client_nic_gbps"))
    return {"peak_bytes_s": peak, "nic_bytes_s": nic, "fraction_of_nic": peak / nic}


# ---------------------------------------------------------------- checkpoints

def checkpoint_seconds(checkpoint_gb: float, ranks: int, nic_gbps: float, storage_gbs: float) -> float:
    """Seconds to write a checkpoint of `checkpoint_gb` GB split evenly over `ranks` writers, each behind a NIC of
    `nic_gbps` Gbps, into storage that takes `storage_gbs` GB/s in all: the slower of the two limits,
    max(checkpoint / ranks / NIC, checkpoint / storage) -- the writers run in parallel, the storage is shared."""
    size, bw, store = number("checkpoint_gb", checkpoint_gb), number("nic_gbps", nic_gbps), \
        number("storage_gbs", storage_gbs)
    whole("ranks", ranks, meaning="writers in parallel")
    return max(size / ranks / (bw / 8), size / store)


def v3_checkpoint() -> dict:
    """DeepSeek-V3's checkpoint as lab 09's memory recipe stores the state (v3model.memory_gb's bytes per parameter
    on the whole model: its 671B parameters and the MTP module's 11.6B). To resume training it needs the optimizer
    state: the FP32 master weights and the BF16 AdamW moments, 8 bytes per parameter (`resumable_gb`); the BF16
    weights are a rounding of the master, so saving them too (10 bytes, `with_weights_gb`) only spares a cast at
    load time. Gradients are not saved; the EMA of the weights, kept in CPU memory, is left out. Also each GPU's
    share of the 2,048, the same optimizer state as lab 13's ZeRO-1 shard per GPU."""
    mem = topology.memory_per_gpu_gb(v3model.sketch(), topology.Layout(), weight_bytes=2,
                                     grad_bytes=v3model.fact("grad_bytes"),
                                     optimizer_bytes=v3model.fact("master_weight_bytes")
                                     + 2 * v3model.fact("adam_moment_bytes"))
    run = v3model.defaults()
    per_gpu = v3model.memory_gb(run)
    params = mem["params_per_gpu_b"] * 1e9
    return {"params": params, "mtp_params": models.count_params(v3model.config())["mtp_total"],
            "weights_gb": mem["weights"], "optimizer_gb": mem["optimizer"], "resumable_gb": mem["optimizer"],
            "with_weights_gb": mem["weights"] + mem["optimizer"], "bytes_per_param": mem["optimizer"] * 1e9 / params,
            "bytes_per_param_with_weights": (mem["weights"] + mem["optimizer"]) * 1e9 / params, "gpus": run.gpus,
            "optimizer_gb_per_gpu": per_gpu["optimizer"], "resumable_gb_per_gpu": mem["optimizer"] / run.gpus}


def v3_checkpoint_seconds(storage_bytes_s: float, with_weights: bool = False) -> float:
    """Seconds to write DeepSeek-V3's resumable checkpoint (v3_checkpoint: 8 B/param; 10 with the BF16 weights) at
    `storage_bytes_s` bytes/s."""
    ck = v3_checkpoint()
    return ck["with_weights_gb" if with_weights else "resumable_gb"] * GB / number("storage_bytes_s", storage_bytes_s)


# ---------------------------------------------------------------- pre-training: can reading tokens bound it?

def token_id_bytes(vocab_size: int) -> int:
    """Bytes per stored token id: the smallest of 1, 2, 4 that holds every id of the vocabulary."""
    for b in (1, 2, 4):
        if vocab_size <= 256 ** b:
            return b
    return 8


def pretraining_reads(bytes_per_token: float | None = None) -> dict:
    """DeepSeek-V3's training token rate (180K H800 GPU-hours per trillion tokens on 2,048 GPUs) times the bytes of
    one tokenized token (uint32 ids for a 129,280-token vocabulary by default): the read bandwidth pre-training
    needs, against 3FS's aggregate read rate."""
    gpu_hours, gpus = v3model.fact("gpu_hours_per_t_tokens"), v3model.fact("gpus")
    tokens_s = 1e12 / (gpu_hours / gpus * 3600)
    b = token_id_bytes(v3model.config()["vocab_size"]) if bytes_per_token is None else \
        number("bytes_per_token", bytes_per_token)
    need = tokens_s * b
    return {"tokens_per_s": tokens_s, "bytes_per_token": b, "bytes_s": need,
            "fraction_of_3fs": need / (fact("read_aggregate_tib_s") * TIB)}


# ---------------------------------------------------------------- the on-disk KV cache of DeepSeek's service

def kv_bytes_per_token(bytes_per_value: float = 2) -> float:
    """DeepSeek-V3's MLA cache per token (lab 11's sizing: 61 layers x 576 values)."""
    return kvcache.deepseek_v3_kv(v3model.config().values, bytes_per_value=bytes_per_value)["mla"]


def kv_cache_reads(hit_tokens_per_day: float | None = None, bytes_per_token: float | None = None) -> dict:
    """The KV-cache bytes the day's cache hits read: the day's average rate for the fleet, and per prefill node (the
    nodes that read them: lab 14's day accounting, `service.reported_day`), against 3FS's KVCache peak read per
    client node and its aggregate read rate. `peak_if_aggregate`: the average over the peak, were the 40 GiB/s the
    sum over all clients (more than 1 means it cannot be)."""
    hits = service("input_tokens_cache_hit_per_day") if hit_tokens_per_day is None else \
        number("hit_tokens_per_day", hit_tokens_per_day)
    b = kv_bytes_per_token() if bytes_per_token is None else number("bytes_per_token", bytes_per_token)
    day = hits * b
    rate = day / SECONDS_PER_DAY
    nodes = service_day.reported_day()["nodes_prefill"]
    peak = service("threefs_kvcache_read_gibs") * GIB
    return {"bytes_per_token": b, "bytes_per_day": day, "bytes_s": rate, "prefill_nodes": nodes,
            "per_prefill_node_bytes_s": rate / nodes, "per_node_fraction_of_peak": rate / nodes / peak,
            "peak_if_aggregate": rate / peak, "fraction_of_3fs": rate / (fact("read_aggregate_tib_s") * TIB)}


def prefill_saved(hit_tokens_per_day: float | None = None, gpu_id: str = "H800-SXM", dtype: str = "fp8") -> dict:
    """The prefill compute the cache hits save: 2 FLOPs per activated parameter per token (the matmuls; attention
    over the prefix left out, so a lower bound), as H800 nodes busy all day at the dense `dtype` peak (a lower bound
    again), and at DeepSeek's own prefill rate per node (which counts hits too); and the read bandwidth per GPU at
    which reading a token's KV cache is as fast as recomputing it at that peak."""
    hits = service("input_tokens_cache_hit_per_day") if hit_tokens_per_day is None else \
        number("hit_tokens_per_day", hit_tokens_per_day)
    active = models.count_params(v3model.config())["active_compute"]
    flops_per_token = 2 * active
    peak = hardware.peak_tflops(gpu_id, dtype) * 1e12
    gpus_per_node = service("gpus_per_node")
    gpu_s = hits * flops_per_token / peak
    return {"flops_per_token": flops_per_token, "flops_per_day": hits * flops_per_token, "peak_flops": peak,
            "nodes_at_peak": gpu_s / gpus_per_node / SECONDS_PER_DAY,
            "nodes_at_service_rate": hits / service("prefill_tokens_per_s_per_node") / SECONDS_PER_DAY,
            "breakeven_read_bytes_s_per_gpu": kv_bytes_per_token() * peak / flops_per_token}

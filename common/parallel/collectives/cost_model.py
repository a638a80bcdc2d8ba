"""The alpha-beta cost model of collectives and nccl-tests' bus bandwidth.

Sending a message of n bytes over one link costs alpha + n / B (alpha: the fixed latency of a step, seconds; B: the
link's bandwidth in one direction, bytes/s; "beta" is 1/B). A collective over p ranks is a sequence of steps; its time
is (number of steps) * alpha + (bytes each rank sends in sequence) / B (the formulas: `common.parallel.collectives`).
"""
from __future__ import annotations

import math

from common.core.validate import number, whole

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
ALLREDUCE_ALGORITHMS = ("ring", "tree", "recursive_doubling", "rabenseifner")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8, "int8": 1}


# --------------------------------------------------------------------------------------------------------------
# Validation


def check_bytes(n_bytes, name: str = "n_bytes") -> float:
    """A message size must be a positive number of bytes."""
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, (int, float)) or not math.isfinite(n_bytes):
        raise ValueError(f"{name}={n_bytes!r} must be a positive number of bytes")
    if n_bytes <= 0:
        raise ValueError(f"{name}={n_bytes!r}: a message size must be positive (> 0 bytes)")
    return n_bytes


def check_ranks(p, name: str = "p") -> int:
    return whole(name, p, meaning="the number of ranks")


def _check_positive(x, name: str) -> float:
    return number(name, x)


def _check_alpha(alpha) -> float:
    return number("alpha", alpha, strict=False, meaning="a latency in seconds")


def check_collective(collective: str) -> str:
    if collective not in COLLECTIVES:
        raise ValueError(f"collective={collective!r} is not known; allowed: {', '.join(COLLECTIVES)}")
    return collective


def _log2_ceil(p: int) -> int:
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


# --------------------------------------------------------------------------------------------------------------
# Bus bandwidth (nccl-tests' convention)


def bus_factor(collective: str, p: int) -> float:
    """busbw / algbw for `collective` over p ranks, as nccl-tests define it."""
    check_collective(collective)
    check_ranks(p)
    if collective == "all_reduce":
        return 2 * (p - 1) / p
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (p - 1) / p
    return 1.0  # broadcast (and reduce)


def algbw(n_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth, bytes/s: the message size over the time."""
    check_bytes(n_bytes)
    _check_positive(seconds, "seconds")
    return n_bytes / seconds


def busbw(collective: str, n_bytes: float, seconds: float, p: int) -> float:
    """Bus bandwidth, bytes/s: algbw times the bus factor (comparable with one link's bandwidth)."""
    return algbw(n_bytes, seconds) * bus_factor(collective, p)


# --------------------------------------------------------------------------------------------------------------
# Alpha-beta cost models (alpha: seconds per step; bandwidth: bytes/s per direction of one rank's link)


def _args(n_bytes, p, alpha, bandwidth):
    check_bytes(n_bytes)
    check_ranks(p)
    _check_alpha(alpha)
    _check_positive(bandwidth, "bandwidth")


def ring_allreduce_time(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    _args(n_bytes, p, alpha, bandwidth)
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes / bandwidth


def ring_reduce_scatter_time(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    _args(n_bytes, p, alpha, bandwidth)
    return (p - 1) * alpha + (p - 1) / p * n_bytes / bandwidth


def ring_allgather_time(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    _args(n_bytes, p, alpha, bandwidth)
    return (p - 1) * alpha + (p - 1) / p * n_bytes / bandwidth


def alltoall_time(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """Pairwise all-to-all: p-1 steps, each rank sends (p-1)/p of its n bytes to the others."""
    _args(n_bytes, p, alpha, bandwidth)
    return (p - 1) * alpha + (p - 1) / p * n_bytes / bandwidth


def tree_allreduce_time(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """Binary tree, not pipelined: reduce up ceil(log2 p) levels, broadcast down as many, whole buffer each step."""
    _args(n_bytes, p, alpha, bandwidth)
    return 2 * _log2_ceil(p) * (alpha + n_bytes / bandwidth)


def recursive_doubling_allreduce_time(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """ceil(log2 p) pairwise exchanges of the whole buffer (exact for p a power of two)."""
    _args(n_bytes, p, alpha, bandwidth)
    return _log2_ceil(p) * (alpha + n_bytes / bandwidth)


def rabenseifner_allreduce_time(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """Recursive-halving reduce-scatter + recursive-doubling all-gather: log latency, ring bandwidth."""
    _args(n_bytes, p, alpha, bandwidth)
    return 2 * _log2_ceil(p) * alpha + 2 * (p - 1) / p * n_bytes / bandwidth


ALLREDUCE_TIMES = {"ring": ring_allreduce_time, "tree": tree_allreduce_time,
              "recursive_doubling": recursive_doubling_allreduce_time, "rabenseifner": rabenseifner_allreduce_time}


def allreduce_time(algorithm: str, n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """All-reduce time under the alpha-beta model for one of ALLREDUCE_ALGORITHMS."""
    if algorithm not in ALLREDUCE_TIMES:
        raise ValueError(f"algorithm={algorithm!r} is not known; allowed: {', '.join(ALLREDUCE_ALGORITHMS)}")
    return ALLREDUCE_TIMES[algorithm](n_bytes, p, alpha, bandwidth)


def steps(collective: str, p: int) -> int:
    """Number of sequential alpha terms of the ring (all-to-all: pairwise) algorithm."""
    check_collective(collective)
    check_ranks(p)
    if collective == "all_reduce":
        return 2 * (p - 1)
    if collective == "broadcast":
        return 1
    return p - 1


def collective_time(collective: str, n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """Time of `collective` with the bandwidth-optimal (ring / pairwise / pipelined) algorithm:
    steps * alpha + bus_factor * n / bandwidth -- so busbw -> bandwidth for large messages."""
    _args(n_bytes, p, alpha, bandwidth)
    return steps(collective, p) * alpha + bus_factor(collective, p) * n_bytes / bandwidth


def hierarchical_allreduce_time(n_bytes: float, nodes: int, gpus_per_node: int, alpha_intra: float,
                                bw_intra: float, alpha_inter: float, bw_inter: float) -> float:
    """Two-level all-reduce: ring reduce-scatter inside each node (NVLink), ring all-reduce of each GPU's n/g shard
    across the nodes (g parallel rings, one per GPU and its NIC, InfiniBand), ring all-gather inside each node."""
    check_bytes(n_bytes)
    check_ranks(nodes, "nodes")
    check_ranks(gpus_per_node, "gpus_per_node")
    g = gpus_per_node
    inside = 0.0
    if g > 1:
        inside = (ring_reduce_scatter_time(n_bytes, g, alpha_intra, bw_intra)
                  + ring_allgather_time(n_bytes, g, alpha_intra, bw_intra))
    across = ring_allreduce_time(n_bytes / g, nodes, alpha_inter, bw_inter) if nodes > 1 else 0.0
    return inside + across


def flat_ring_allreduce_time(n_bytes: float, nodes: int, gpus_per_node: int, alpha_intra: float, bw_intra: float,
                             alpha_inter: float, bw_inter: float, rings: int = 1) -> float:
    """Ring all-reduce over all nodes * gpus_per_node ranks, the buffer split over `rings` rings run at once (NCCL
    runs one ring per NIC: `rings` = gpus_per_node on nodes with a NIC per GPU). Every step of a ring waits for its
    slowest link and pays the larger alpha: a ring's inter-node hops have a NIC each (bw_inter), its intra-node hops
    share the GPU's NVLink with the other rings (bw_intra / rings)."""
    check_ranks(nodes, "nodes")
    check_ranks(gpus_per_node, "gpus_per_node")
    check_ranks(rings, "rings")
    p = nodes * gpus_per_node
    if nodes == 1:
        return ring_allreduce_time(n_bytes, p, alpha_intra, bw_intra)
    return ring_allreduce_time(n_bytes / rings, p, max(alpha_intra, alpha_inter), min(bw_intra / rings, bw_inter))


def two_level_alltoall_time(n_bytes: float, nodes: int, gpus_per_node: int, alpha_intra: float, bw_intra: float,
                            alpha_inter: float, bw_inter: float) -> float:
    """All-to-all over nodes * gpus_per_node ranks, each sending n bytes spread evenly: the share for other GPUs of
    the same node crosses NVLink, the share for other nodes crosses the GPU's NIC; both run at once (the slower
    sets the time), and each peer costs one alpha of its link."""
    check_bytes(n_bytes)
    check_ranks(nodes, "nodes")
    check_ranks(gpus_per_node, "gpus_per_node")
    _check_alpha(alpha_intra)
    _check_alpha(alpha_inter)
    _check_positive(bw_intra, "bw_intra")
    _check_positive(bw_inter, "bw_inter")
    g, p = gpus_per_node, nodes * gpus_per_node
    intra = (g - 1) * alpha_intra + n_bytes * (g - 1) / p / bw_intra
    inter = (p - g) * alpha_inter + n_bytes * (p - g) / p / bw_inter
    return max(intra, inter)

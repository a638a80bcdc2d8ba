"""Accelerator and interconnect facts from data/hardware.json, each number traceable to its source.

    gpu_ids()                       -> ["A100-SXM", "H100-SXM", "H800-SXM", "H200-SXM", "B200", "GB200"]
    gpu("H100-SXM")                 -> GPU(sms=132, hbm_gb=80, hbm_bandwidth_tbs=3.35, ...)
    peak_tflops("H100-SXM", "bf16") -> 989.5   (dense; sparse=True gives the 2:4-sparsity rate)
    ridge_point("H100-SXM", "bf16") -> 295.4   FLOPs per byte of HBM traffic (dense)
    interconnect("nvlink4")         -> Link(gbs_bidirectional=900, links_per_gpu=18, ...)
    source("H800-SXM", "nvlink_gbs")-> {"title": ..., "url": ..., "date": ..., "note": ...}

Conventions: TFLOPS per GPU; dtypes "fp64" (the FP64 *tensor-core* rate), "tf32", "bf16" (= fp16 rate), "fp8", "fp4";
dense and sparse kept apart (NVIDIA datasheets quote tensor rates with 2:4 sparsity; ridge points and MFU use dense).
GB200 means one Blackwell GPU inside a GB200 NVL72 rack. HBM in decimal GB, bandwidth in TB/s (10^12 bytes/s).
"""
from __future__ import annotations

import copy
import difflib
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

DATA_FILE = Path(__file__).resolve().parents[2] / "data" / "hardware.json"
DTYPES = ("fp64", "tf32", "bf16", "fp8", "fp4")
# dtype aliases a caller may use; fp16 runs at the bf16 tensor rate on every GPU in the table
_DTYPE_ALIASES = {"fp16": "bf16", "float16": "bf16", "bfloat16": "bf16", "float64": "fp64", "float8": "fp8",
                  "e4m3": "fp8", "e5m2": "fp8", "nvfp4": "fp4", "mxfp4": "fp4"}


class UnknownHardware(ValueError):
    """An id that is not in data/hardware.json; the message lists the known ids and the closest match."""


class UnsupportedDtype(ValueError):
    """A dtype the GPU has no tensor-core rate for (fp4 on an H100, fp8 on an A100); never reported as 0."""


@dataclass(frozen=True, eq=False)
class GPU:
    id: str
    name: str
    architecture: str
    sms: int
    hbm_gb: float  # decimal GB, as published
    hbm_type: str
    hbm_bandwidth_tbs: float  # TB/s
    l2_mb: float
    nvlink_gbs: float  # GB/s per GPU, both directions added, as NVIDIA quotes it
    nvlink_generation: int
    nvlink_links: int
    tdp_w: float
    pcie: str
    tflops: dict  # dtype -> {"dense": x, "sparse": y or None}
    system: dict | None = None  # GB200: the NVL72 rack totals
    differs_from: dict | None = None  # H800: what differs from the H100 and why
    notes: dict = field(default_factory=dict)

    @property
    def hbm_bandwidth_gbs(self) -> float:
        return self.hbm_bandwidth_tbs * 1e3

    def peak_tflops(self, dtype: str, sparse: bool = False) -> float:
        return peak_tflops(self.id, dtype, sparse)

    def ridge_point(self, dtype: str, sparse: bool = False) -> float:
        return ridge_point(self.id, dtype, sparse)


@dataclass(frozen=True)
class Link:
    id: str
    name: str
    kind: str  # "nvlink", "infiniband" or "pcie"
    generation: int | None
    scope: str  # "per GPU", "per port" or "per x16 slot"
    gbs_per_direction: float  # GB/s, one direction
    gbs_bidirectional: float  # GB/s, both directions added
    gbps_per_direction: float  # Gb/s (bits), one direction: how network ports are named
    links_per_gpu: int | None = None  # NVLink only
    gbs_per_link: float | None = None  # NVLink only, both directions
    note: str = ""


@functools.lru_cache(maxsize=1)
def _data() -> dict:
    with DATA_FILE.open() as f:
        return json.load(f)


def reload() -> None:
    """Forget the cached file (tests that edit data/ use this)."""
    _data.cache_clear()


def _resolve(value: str, known: list[str], what: str, param: str) -> str:
    if isinstance(value, str):
        if value in known:
            return value
        for k in known:  # forgive case: "h100-sxm" -> "H100-SXM"
            if k.lower() == value.lower():
                return k
    close = difflib.get_close_matches(str(value), known, n=1, cutoff=0.0) if isinstance(value, str) else []
    hint = f"; closest match: {close[0]!r}" if close else ""
    raise UnknownHardware(f"{param}={value!r} is not a known {what}; known: {', '.join(known)}{hint}")


def gpu_ids() -> list[str]:
    """The GPU ids of data/hardware.json, oldest first; the ledger uses these spellings."""
    return list(_data()["gpus"])


def interconnect_ids() -> list[str]:
    return list(_data()["interconnects"])


def gpu(gpu_id: str) -> GPU:
    """The facts of one GPU; an unknown id raises UnknownHardware naming the known ids and the closest one."""
    gid = _resolve(gpu_id, gpu_ids(), "GPU id", "gpu_id")
    raw = copy.deepcopy(_data()["gpus"][gid])  # a caller editing g.tflops must not change the table
    names = {f for f in GPU.__dataclass_fields__ if f != "id"}
    return GPU(id=gid, **{k: v for k, v in raw.items() if k in names})


def interconnect(link_id: str) -> Link:
    """One link: NVLink 3/4/5 per GPU, InfiniBand HDR/NDR/XDR per port, PCIe Gen5 x16."""
    lid = _resolve(link_id, interconnect_ids(), "interconnect id", "link_id")
    raw = _data()["interconnects"][lid]
    names = set(Link.__dataclass_fields__) - {"id"}
    return Link(id=lid, **{k: v for k, v in raw.items() if k in names})


def nvlink(gpu_id: str) -> Link:
    """The NVLink generation a GPU uses (its own per-GPU total is gpu(gpu_id).nvlink_gbs: 400 on an H800)."""
    return interconnect(f"nvlink{gpu(gpu_id).nvlink_generation}")


def normalize_dtype(dtype: str) -> str:
    """'bf16', 'fp16', 'float64', ... -> one of DTYPES; anything else raises ValueError naming the allowed ones."""
    if isinstance(dtype, str):
        d = dtype.lower().replace("torch.", "")
        d = _DTYPE_ALIASES.get(d, d)
        if d in DTYPES:
            return d
    raise ValueError(f"dtype={dtype!r} is not a tensor dtype of the table; allowed: {', '.join(DTYPES)} "
                     f"(fp16 counts as bf16)")


def supported_dtypes(gpu_id: str) -> list[str]:
    """The dtypes with a tensor-core rate on this GPU, in DTYPES order."""
    rates = gpu(gpu_id).tflops
    return [d for d in DTYPES if d in rates]


def gpus_supporting(dtype: str) -> list[str]:
    d = normalize_dtype(dtype)
    return [g for g in gpu_ids() if d in gpu(g).tflops]


def peak_tflops(gpu_id: str, dtype: str, sparse: bool = False) -> float:
    """Peak tensor-core TFLOPS of one GPU: dense by default, sparse=True for the 2:4-sparsity datasheet rate.

    fp64 is the FP64 tensor-core rate (an H100's 67, not its 34 vector rate). A dtype the GPU lacks raises
    UnsupportedDtype naming the GPUs that have it; a dtype without a sparse rate (fp64) raises with sparse=True.
    """
    g = gpu(gpu_id)
    d = normalize_dtype(dtype)
    if d not in g.tflops:
        why = g.notes.get(f"tflops.{d}", "")
        raise UnsupportedDtype(f"{g.id} has no {d} tensor-core rate{f': {why}' if why else ''}; "
                               f"{d} is supported on: {', '.join(gpus_supporting(d))}")
    rate = g.tflops[d]["sparse" if sparse else "dense"]
    if rate is None:
        raise UnsupportedDtype(f"{g.id} has no sparse {d} rate (2:4 sparsity does not apply to {d}); "
                               f"use sparse=False")
    return float(rate)


def ridge_point(gpu_id: str, dtype: str, sparse: bool = False) -> float:
    """FLOPs per byte of HBM traffic where the roofline turns from memory- to compute-bound (dense by default).

    ridge = peak FLOP/s / HBM bytes/s = (TFLOPS * 1e12) / (TB/s * 1e12).
    """
    g = gpu(gpu_id)
    return peak_tflops(g.id, dtype, sparse) / g.hbm_bandwidth_tbs


def _field_names(raw: dict) -> list[str]:
    names = [k for k in raw if k not in ("sources", "notes", "tflops", "name")]
    names += ["tflops"] + [f"tflops.{d}" for d in raw["tflops"]]
    return names


def source(hw_id: str, field: str = "*") -> dict:
    """Where a number comes from: {"title", "url", "date", "accessed", "confirmed_via", and "note" if any}.

    hw_id is a GPU id or an interconnect id; field is a GPU field ("hbm_bandwidth_tbs", "tflops.bf16", ...) or "*".
    """
    data = _data()
    if isinstance(hw_id, str) and hw_id.lower() in {k.lower() for k in interconnect_ids()}:
        lid = _resolve(hw_id, interconnect_ids(), "interconnect id", "hw_id")
        raw = data["interconnects"][lid]
        out = dict(data["sources"][raw["source"]])
        if raw.get("note"):
            out["note"] = raw["note"]
        return out
    gid = _resolve(hw_id, gpu_ids() + interconnect_ids(), "GPU or interconnect id", "hw_id")
    raw = data["gpus"][gid]
    fields = _field_names(raw)
    if field != "*" and field not in fields and not field.startswith("tflops."):
        raise ValueError(f"field={field!r} is not a field of {gid}; fields: {', '.join(fields)}")
    if field.startswith("tflops.") and field.split(".", 1)[1] not in raw["tflops"]:
        note = raw.get("notes", {}).get(field, "")
        raise UnsupportedDtype(f"{gid} has no {field.split('.', 1)[1]} rate, so it has no source"
                               f"{f' ({note})' if note else ''}")
    srcs = raw["sources"]
    key = srcs.get(field) or srcs.get(field.split(".")[0]) or srcs["*"]
    out = dict(data["sources"][key])
    notes = raw.get("notes", {})
    parts = [n for n in (notes.get("*"), notes.get(field.split(".")[0]) if "." in field else None, notes.get(field))
             if n]
    if parts:
        out["note"] = "; ".join(dict.fromkeys(parts))
    return out


def gpu_variant(variant_id: str) -> dict:
    """A card that shares a chip with a GPU of the table but not its memory system ("H100-NVL"): its sourced facts."""
    variants = {k: v for k, v in _data()["gpu_variants"].items() if k != "description"}
    return dict(variants[_resolve(variant_id, sorted(variants), "GPU variant id", "variant_id")])


def table(dtype: str = "bf16") -> list[dict]:
    """One row per GPU (for a printed table): memory, bandwidth, dense/sparse rate of `dtype`, ridge point."""
    d = normalize_dtype(dtype)
    rows = []
    for gid in gpu_ids():
        g = gpu(gid)
        ok = d in g.tflops
        rows.append({"gpu": gid, "hbm_gb": g.hbm_gb, "hbm_tbs": g.hbm_bandwidth_tbs, "nvlink_gbs": g.nvlink_gbs,
                     f"{d}_dense_tflops": g.tflops[d]["dense"] if ok else None,
                     f"{d}_sparse_tflops": g.tflops[d]["sparse"] if ok else None,
                     "ridge_flops_per_byte": ridge_point(gid, d) if ok else None})
    return rows

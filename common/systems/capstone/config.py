"""The block's sizes and the versions of its step: what lab 12 profiles, and the changes the guard may keep.

`BlockConfig` holds a DeepSeek-V3 MoE layer's shape at laptop size: MLA attention (low-rank query and key/value
latents, `q_rank` and `kv_rank` wide), a shared expert and `top_k` of `experts` routed SwiGLU experts of width
`expert_ffn`, the DeepSeek-V3 gate (group-limited). `QUICK` was chosen so that the final step's measured profile
ranks its costs as a V3 layer's FLOPs and bytes rank them (routed experts, attention core, MLA projections; see
`costs`), on one CPU thread, in float32; `FULL` is the same block at GPU size.

A `Version` says which implementation each part of the step uses. `BASELINE` is naive in the ways released code
is (Hugging Face's DeepSeek training branch loops over experts with boolean masks; eager attention materialises
the scores and adds a causal mask built every step; RMSNorm written out; the loss logged with `.item()` every
step). `CANDIDATES` are the changes lab 12 tries, in the order its profile ranks them; `as_dict` / `from_dict`
carry a version to `python -m common.systems.capstone` (the kept one, for nsys).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from common.core.validate import whole
from common.moe import moe


@dataclass(frozen=True)
class BlockConfig:
    batch: int = 1
    seq: int = 256
    hidden: int = 192
    heads: int = 6
    head_dim: int = 64
    q_rank: int = 48  # MLA query latent (DeepSeek-V3: 1536 of 7168)
    kv_rank: int = 24  # MLA key/value latent, what an MLA cache holds (DeepSeek-V3: 512 of 7168)
    experts: int = 256  # routed experts (the shared one comes on top)
    top_k: int = 8
    n_group: int = 8
    topk_group: int = 4
    expert_ffn: int = 24  # intermediate size of each expert, routed and shared (DeepSeek-V3: 2048 of 7168)
    route_scale: float = 2.5
    eps: float = 1e-6
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("batch", "seq", "hidden", "heads", "head_dim", "q_rank", "kv_rank", "experts", "top_k",
                     "n_group", "topk_group", "expert_ffn"):
            whole(name, getattr(self, name))
        moe.check_routing(self.experts, self.top_k, self.n_group, self.topk_group)
        if self.dtype not in ("float32", "float64", "bfloat16"):
            raise ValueError(f"dtype={self.dtype!r}; allowed: 'float32', 'float64', 'bfloat16'")

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def attn_width(self) -> int:
        """heads x head_dim: the width of Q, K, V and of the output projection's input."""
        return self.heads * self.head_dim

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


QUICK = BlockConfig()
FULL = BlockConfig(batch=2, seq=2048, hidden=1024, heads=8, head_dim=128, q_rank=256, kv_rank=128, experts=256,
                   top_k=8, n_group=8, topk_group=4, expert_ffn=256)


def config_for(profile: str) -> BlockConfig:
    """The block's size for a resolved profile: `quick` (one CPU thread) or `full` (a GPU)."""
    if profile not in ("quick", "full"):
        raise ValueError(f"profile={profile!r} is not a resolved profile; allowed: 'quick', 'full'")
    return QUICK if profile == "quick" else FULL


MOE = ("loop", "sorted", "grouped")
ATTENTION = ("eager", "sdpa")
NORM = ("eager", "fused")


@dataclass(frozen=True)
class Version:
    """Which implementation each part of the step uses."""

    name: str
    moe: str = "loop"  # "loop": boolean masks (HF's training branch); "sorted": contiguous slices; "grouped": bmm
    attention: str = "eager"  # "eager": scores materialised, mask added; "sdpa": fused, causal, no mask
    norm: str = "eager"  # "eager": RMSNorm written out; "fused": torch.nn.functional.rms_norm
    log_loss: bool = True  # read the loss and the expert load on the host every step (.item(), .tolist())

    def __post_init__(self):
        for field, allowed in (("moe", MOE), ("attention", ATTENTION), ("norm", NORM)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field}={getattr(self, field)!r}; allowed: {', '.join(map(repr, allowed))}")


BASELINE = Version("baseline")
CANDIDATES = (("sorted dispatch", {"moe": "sorted"}), ("grouped GEMM", {"moe": "grouped"}),
              ("SDPA attention", {"attention": "sdpa"}), ("fused RMSNorm", {"norm": "fused"}),
              ("no per-step host sync", {"log_loss": False}))
FIELDS = ("moe", "attention", "norm", "log_loss")


def apply(version: Version, name: str, change: dict) -> Version:
    """`version` with one candidate change applied, named "+ name"."""
    unknown = set(change) - set(FIELDS)
    if unknown:
        raise ValueError(f"change={change!r} sets unknown fields {sorted(unknown)}")
    return replace(version, name=f"+ {name}", **change)


def all_applied(candidates=CANDIDATES) -> Version:
    """Every candidate applied on top of the baseline (what the loop would reach if it kept them all)."""
    v = BASELINE
    for name, change in candidates:
        v = apply(v, name, change)
    return replace(v, name="all changes")


def as_dict(version: Version) -> dict:
    """A version as plain data (what lab 12 writes for `python -m common.systems.capstone --version kept`)."""
    return {"name": version.name, **{f: getattr(version, f) for f in FIELDS}}


def from_dict(data: dict) -> Version:
    unknown = set(data) - set(FIELDS) - {"name"}
    if unknown:
        raise ValueError(f"a version has no fields {sorted(unknown)}; fields: name, {', '.join(FIELDS)}")
    return Version(**data)

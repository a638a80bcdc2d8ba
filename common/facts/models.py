"""Model configs from data/models/ and parameter counting: total vs activated per token.

`load_model_config("deepseek_v3")` reads data/models/deepseek_v3.json and validates it (a missing or wrong-typed
key fails naming the key and the file). `count_params(cfg)` counts every weight matrix and norm of the transformer:
embedding, attention (MLA or grouped-query), dense FFN layers, routed and shared experts, the router (gate), norms,
the output head, and the multi-token-prediction (MTP) modules, which are reported apart.

Conventions (the same for every model, so they can be compared):
- `total`: all parameters of the main model (embedding and output head included, MTP modules excluded);
- `active`: what one token touches: everything except the routed experts it was not sent to
  (`num_experts_per_tok` of `n_routed_experts`); the input embedding is counted, as the model authors do;
- `active_compute`: `active` minus the input embedding (a table lookup, not a matmul) -- the N of "2N FLOPs per token".
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from common.core.env import REPO_ROOT

MODELS_DIR = REPO_ROOT / "data" / "models"

# key -> allowed types. bool is checked apart (it is an int in Python).
_COMMON_KEYS = {
    "vocab_size": int, "hidden_size": int, "num_hidden_layers": int, "first_k_dense_replace": int,
    "intermediate_size": int, "moe_intermediate_size": int, "n_routed_experts": int, "n_shared_experts": int,
    "num_experts_per_tok": int, "n_group": int, "topk_group": int, "routed_scaling_factor": (int, float),
    "scoring_func": str, "norm_topk_prob": bool, "attention": str, "num_attention_heads": int,
    "num_key_value_heads": int, "num_nextn_predict_layers": int, "tie_word_embeddings": bool,
}
_MLA_KEYS = {"q_lora_rank": int, "kv_lora_rank": int, "qk_nope_head_dim": int, "qk_rope_head_dim": int,
             "v_head_dim": int}
_GQA_KEYS = {"head_dim": int}
_OPTIONAL_KEYS = {"topk_method": str, "max_position_embeddings": int, "rope_scaling": dict}
SCORING_FUNCS = ("sigmoid", "softmax")
ATTENTION_KINDS = ("mla", "gqa")


class FrozenDict(dict):
    """A config's nested mapping (DeepSeek-V3's rope_scaling): read-only and hashable, so a config's values stay
    usable as a cache key (`tuple(sorted(values.items()))`)."""

    def __hash__(self):
        return hash(tuple(sorted(self.items())))

    def _read_only(self, *args, **kwargs):
        raise TypeError("a model config's nested mapping is read-only (use ModelConfig.replace)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _read_only


@dataclass(frozen=True)
class ModelConfig:
    """A validated model config: the architecture keys (attribute or item access), its name, source and the
    authors' published parameter counts."""

    key: str  # file stem, e.g. "deepseek_v3"
    name: str  # display name, e.g. "DeepSeek-V3"
    values: dict
    source: dict = field(default_factory=dict)
    published: dict = field(default_factory=dict)
    path: str = ""
    inference: dict = field(default_factory=dict)  # the authors' inference code's settings (DeepSeek-V3: max_seq_len)

    def __getattr__(self, item):
        values = object.__getattribute__(self, "values")
        if item in values:
            return values[item]
        raise AttributeError(f"model config {object.__getattribute__(self, 'key')!r} has no key {item!r}")

    def __getitem__(self, item):
        return self.values[item]

    def get(self, item, default=None):
        return self.values.get(item, default)

    @property
    def moe_layers(self) -> int:
        return self.values["num_hidden_layers"] - self.values["first_k_dense_replace"]

    @property
    def dense_layers(self) -> int:
        return self.values["first_k_dense_replace"]

    def replace(self, **changes) -> "ModelConfig":
        """A copy with some keys changed, validated again (for what-if questions)."""
        values = {**self.values, **changes}
        validate_config(values, f"{self.key} (modified)")
        return ModelConfig(self.key, self.name, values, self.source, self.published, self.path, self.inference)


def model_names() -> list[str]:
    """The configs in data/models/, by file stem."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def _type_name(t) -> str:
    if isinstance(t, tuple):
        return " or ".join(x.__name__ for x in t)
    return t.__name__


def _check_type(values: dict, key: str, expected, where: str) -> None:
    if key not in values:
        raise ValueError(f"{where}: missing key {key!r} (expected {_type_name(expected)})")
    v = values[key]
    ok = isinstance(v, bool) if expected is bool else (isinstance(v, expected) and not isinstance(v, bool))
    if not ok:
        raise ValueError(f"{where}: key {key!r} is {type(v).__name__} {v!r}, expected {_type_name(expected)}")


def validate_config(values: dict, where: str = "config") -> None:
    """Check keys, types and the relations between them; raise ValueError naming the key and `where`."""
    if not isinstance(values, dict):
        raise ValueError(f"{where}: 'config' must be an object of keys, got {type(values).__name__}")
    for key, t in _COMMON_KEYS.items():
        _check_type(values, key, t, where)
    if values["attention"] not in ATTENTION_KINDS:
        raise ValueError(f"{where}: key 'attention' is {values['attention']!r}; allowed: {', '.join(ATTENTION_KINDS)}")
    for key, t in (_MLA_KEYS if values["attention"] == "mla" else _GQA_KEYS).items():
        _check_type(values, key, t, where)
    for key, t in _OPTIONAL_KEYS.items():
        if key in values:
            _check_type(values, key, t, where)
    if values["scoring_func"] not in SCORING_FUNCS:
        raise ValueError(f"{where}: key 'scoring_func' is {values['scoring_func']!r}; allowed: "
                         f"{', '.join(SCORING_FUNCS)}")
    positive = ["vocab_size", "hidden_size", "num_hidden_layers", "n_group", "topk_group", "num_attention_heads",
                "num_key_value_heads"]
    moe_keys = ["n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"]
    dense_model = values["first_k_dense_replace"] == values["num_hidden_layers"]  # no MoE layer: experts may be 0
    for key in positive + ([] if dense_model else moe_keys):
        if values[key] <= 0:
            raise ValueError(f"{where}: key {key!r} is {values[key]}, must be > 0"
                             + ("" if key in positive else " (0 only in a dense model: first_k_dense_replace = "
                                                           "num_hidden_layers)"))
    for key in moe_keys if dense_model else []:
        if values[key] < 0:
            raise ValueError(f"{where}: key {key!r} is {values[key]}, must be >= 0")
    for key in ("first_k_dense_replace", "n_shared_experts", "num_nextn_predict_layers", "intermediate_size"):
        if values[key] < 0:
            raise ValueError(f"{where}: key {key!r} is {values[key]}, must be >= 0")
    if values["first_k_dense_replace"] > values["num_hidden_layers"]:
        raise ValueError(f"{where}: key 'first_k_dense_replace' ({values['first_k_dense_replace']}) exceeds "
                         f"num_hidden_layers ({values['num_hidden_layers']})")
    if values["num_experts_per_tok"] > values["n_routed_experts"]:
        raise ValueError(f"{where}: key 'num_experts_per_tok' ({values['num_experts_per_tok']}) exceeds "
                         f"n_routed_experts ({values['n_routed_experts']})")
    if values["n_routed_experts"] % values["n_group"]:
        raise ValueError(f"{where}: key 'n_group' ({values['n_group']}) does not divide n_routed_experts "
                         f"({values['n_routed_experts']})")
    if values["topk_group"] > values["n_group"]:
        raise ValueError(f"{where}: key 'topk_group' ({values['topk_group']}) exceeds n_group ({values['n_group']})")
    if values["num_attention_heads"] % values["num_key_value_heads"]:
        raise ValueError(f"{where}: key 'num_key_value_heads' ({values['num_key_value_heads']}) does not divide "
                         f"num_attention_heads ({values['num_attention_heads']})")


def load_model_config(name: str, models_dir: Path | str | None = None) -> ModelConfig:
    """Read and validate data/models/<name>.json ("deepseek_v3", "kimi_k2", "mixtral_8x7b", "llama3_70b")."""
    folder = Path(models_dir) if models_dir is not None else MODELS_DIR
    path = folder / f"{name}.json"
    if not path.exists():
        known = sorted(p.stem for p in folder.glob("*.json"))
        raise ValueError(f"model {name!r}: no file {path.name} in data/models; known: {', '.join(known)}")
    where = f"data/models/{path.name}"
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
    for key in ("name", "source", "config"):
        if key not in doc:
            raise ValueError(f"{where}: missing top-level key {key!r}")
    src = doc["source"]
    if not isinstance(src, dict) or not all(isinstance(src.get(k), str) and src.get(k) for k in ("title", "url", "date")):
        raise ValueError(f"{where}: key 'source' needs 'title', 'url' and 'date' strings")
    validate_config(doc["config"], where)
    values = {k: FrozenDict(v) if isinstance(v, dict) else v for k, v in doc["config"].items()}
    return ModelConfig(key=name, name=doc["name"], values=values, source=src,
                       published=doc.get("published", {}), path=where, inference=doc.get("inference", {}))


# ---------------------------------------------------------------- parameter counting

def attention_params(cfg) -> int:
    """Weights of one attention block (projections and, for MLA, its two low-rank norms)."""
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    if cfg["attention"] == "mla":
        qr, kvr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
        nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        q = h * qr + qr + qr * nh * (nope + rope) if qr else h * nh * (nope + rope)  # q_a, q_a_norm, q_b
        kv = h * (kvr + rope) + kvr + kvr * nh * (nope + vd)  # kv_a (latent + shared rope key), norm, kv_b
        out = nh * vd * h
        return q + kv + out
    hd, nkv = cfg["head_dim"], cfg["num_key_value_heads"]
    return h * nh * hd + 2 * h * nkv * hd + nh * hd * h  # q, k and v, o


def ffn_params(hidden: int, intermediate: int) -> int:
    """A SwiGLU FFN: gate, up and down projections."""
    return 3 * hidden * intermediate


def gate_params(cfg) -> int:
    """The router: one score vector per routed expert, plus the selection bias of aux-loss-free balancing."""
    bias = cfg["n_routed_experts"] if cfg.get("topk_method") == "noaux_tc" else 0
    return cfg["n_routed_experts"] * cfg["hidden_size"] + bias


def count_params(cfg) -> dict:
    """Total and per-token activated parameters of a model config, with a breakdown.

    Returns {"total", "active", "active_compute", "mtp_total", "mtp_active", "total_with_mtp", "breakdown"} where
    breakdown maps each component (embedding, attention, dense_ffn, routed_experts, shared_experts, gate, norms,
    lm_head) to {"total", "active"}. Counts are Python ints (exact).
    """
    if isinstance(cfg, dict):
        validate_config(cfg)
    h, v, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    dense = cfg["first_k_dense_replace"]
    moe = L - dense
    expert = ffn_params(h, cfg["moe_intermediate_size"])
    n_r, n_s, k = cfg["n_routed_experts"], cfg["n_shared_experts"], cfg["num_experts_per_tok"]
    attn = attention_params(cfg)
    b = {
        "embedding": (v * h, v * h),
        "attention": (L * attn, L * attn),
        "dense_ffn": (dense * ffn_params(h, cfg["intermediate_size"]),) * 2,
        "routed_experts": (moe * n_r * expert, moe * k * expert),
        "shared_experts": (moe * n_s * expert,) * 2,
        "gate": (moe * gate_params(cfg),) * 2,
        "norms": (L * 2 * h + h,) * 2,  # pre-attention and pre-FFN RMSNorm per layer, final norm
        "lm_head": (0 if cfg["tie_word_embeddings"] else v * h,) * 2,
    }
    breakdown = {name: {"total": t, "active": a} for name, (t, a) in b.items()}
    total = sum(t for t, _ in b.values())
    active = sum(a for _, a in b.values())
    # One MTP module: two RMSNorms (enorm, hnorm), a projection of [h; h] to h, one more MoE transformer layer and
    # its final norm; it shares the embedding and the output head with the main model.
    n_mtp = cfg["num_nextn_predict_layers"]
    layer_total = attn + 2 * h + n_r * expert + n_s * expert + gate_params(cfg)
    layer_active = attn + 2 * h + (k + n_s) * expert + gate_params(cfg)
    mtp_total = n_mtp * (2 * h + 2 * h * h + layer_total + h)
    mtp_active = n_mtp * (2 * h + 2 * h * h + layer_active + h)
    return {"total": total, "active": active, "active_compute": active - v * h, "mtp_total": mtp_total,
            "mtp_active": mtp_active, "total_with_mtp": total + mtp_total, "breakdown": breakdown}


def params_table(names=None):
    """A pandas table: our count vs the authors' published figures, in billions, for each model in data/models."""
    import pandas as pd
    rows = []
    for name in names or model_names():
        cfg = load_model_config(name)
        c = count_params(cfg)
        rows.append({"model": cfg.name, "total_B": c["total"] / 1e9,
                     "published_total_B": cfg.published.get("params_total", float("nan")) / 1e9,
                     "active_B": c["active"] / 1e9,
                     "published_active_B": cfg.published.get("params_active", float("nan")) / 1e9,
                     "mtp_B": c["mtp_total"] / 1e9})
    return pd.DataFrame(rows).set_index("model")

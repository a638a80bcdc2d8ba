"""common.facts.models: config loading and validation, parameter counts against the published figures."""
import json

import pytest

from common.facts import models
from common.facts.models import count_params, load_model_config, model_names


def test_known_models_load_with_sources():
    assert {"deepseek_v3", "kimi_k2", "mixtral_8x7b"} <= set(model_names())
    for name in ("deepseek_v3", "kimi_k2", "mixtral_8x7b"):
        cfg = load_model_config(name)
        assert cfg.source["url"].startswith("https://") and cfg.source["date"][:2] == "20"
        assert cfg.published["params_total"] > cfg.published["params_active"] > 0


def test_deepseek_v3_config_values():
    cfg = load_model_config("deepseek_v3")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.first_k_dense_replace) == (7168, 61, 3)
    assert (cfg.n_routed_experts, cfg.n_shared_experts, cfg.num_experts_per_tok) == (256, 1, 8)
    assert (cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor, cfg.scoring_func) == (8, 4, 2.5, "sigmoid")
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg["qk_rope_head_dim"]) == (1536, 512, 64)
    assert cfg.moe_layers == 58 and cfg.dense_layers == 3


def test_deepseek_v3_counts_match_published():
    c = count_params(load_model_config("deepseek_v3"))
    assert c["total"] == 671_026_419_200
    assert abs(c["total"] / 671e9 - 1) < 0.001
    assert abs(c["active"] / 37e9 - 1) < 0.02
    assert abs(c["active_compute"] / 36.6e9 - 1) < 0.005  # README_WEIGHTS: 36.7B / older text 36.6B incl. head
    assert abs(c["mtp_total"] / 11.5e9 - 1) < 0.02  # README_WEIGHTS: 11.5B unique MTP parameters
    assert sum(v["total"] for v in c["breakdown"].values()) == c["total"]
    assert sum(v["active"] for v in c["breakdown"].values()) == c["active"]


@pytest.mark.parametrize("name, total, active, tol_total, tol_active", [
    ("kimi_k2", 1.0e12, 32e9, 0.03, 0.03), ("mixtral_8x7b", 46.7e9, 12.9e9, 0.001, 0.002)])
def test_other_models_match_published(name, total, active, tol_total, tol_active):
    c = count_params(load_model_config(name))
    assert abs(c["total"] / total - 1) < tol_total
    assert abs(c["active"] / active - 1) < tol_active


def test_mixtral_by_hand():
    cfg = load_model_config("mixtral_8x7b")
    h, v, f = 4096, 32000, 14336
    attn = h * 4096 * 2 + h * 1024 * 2
    expert = 3 * h * f
    total = 2 * v * h + 32 * (attn + 8 * expert + 8 * h + 2 * h) + h
    c = count_params(cfg)
    assert c["total"] == total and c["active"] == total - 32 * 6 * expert and c["mtp_total"] == 0


def test_llama3_70b_dense_gqa():
    cfg = load_model_config("llama3_70b")
    assert (cfg.attention, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == ("gqa", 64, 8, 128)
    assert cfg.moe_layers == 0 and cfg.dense_layers == 80
    c = count_params(cfg)
    h, v, f, L = 8192, 128256, 28672, 80
    assert c["total"] == 2 * v * h + L * (2 * h * h + 2 * h * 1024 + 3 * h * f + 2 * h) + h
    assert c["active"] == c["total"] and abs(c["total"] / 70.6e9 - 1) < 0.001


def test_experts_zero_only_in_a_dense_model(tmp_path):
    d = _write(tmp_path, lambda doc: doc["config"].update(n_routed_experts=0, num_experts_per_tok=0))
    with pytest.raises(ValueError, match=r"'n_routed_experts' is 0, must be > 0 \(0 only in a dense model"):
        load_model_config("broken", d)


def test_dict_config_and_replace():
    cfg = load_model_config("deepseek_v3")
    assert count_params(dict(cfg.values))["total"] == count_params(cfg)["total"]
    fewer = cfg.replace(n_routed_experts=128)
    assert count_params(fewer)["total"] < count_params(cfg)["total"]
    assert count_params(fewer)["active"] < count_params(cfg)["active"]  # the gate shrinks


def _write(tmp_path, mutate):
    doc = json.loads((models.MODELS_DIR / "deepseek_v3.json").read_text())
    mutate(doc)
    (tmp_path / "broken.json").write_text(json.dumps(doc))
    return tmp_path


def test_missing_key_names_key_and_file(tmp_path):
    d = _write(tmp_path, lambda doc: doc["config"].pop("hidden_size"))
    with pytest.raises(ValueError, match=r"broken\.json.*missing key 'hidden_size'"):
        load_model_config("broken", d)


def test_wrong_type_names_key_and_file(tmp_path):
    d = _write(tmp_path, lambda doc: doc["config"].update(n_routed_experts="256"))
    with pytest.raises(ValueError, match=r"broken\.json.*'n_routed_experts' is str '256', expected int"):
        load_model_config("broken", d)
    d = _write(tmp_path, lambda doc: doc["config"].update(norm_topk_prob=1))
    with pytest.raises(ValueError, match=r"'norm_topk_prob' is int 1, expected bool"):
        load_model_config("broken", d)
    d = _write(tmp_path, lambda doc: doc["config"].update(hidden_size=True))
    with pytest.raises(ValueError, match=r"'hidden_size' is bool True, expected int"):
        load_model_config("broken", d)


def test_bad_relations_and_sources(tmp_path):
    d = _write(tmp_path, lambda doc: doc["config"].update(n_group=7))
    with pytest.raises(ValueError, match=r"'n_group' \(7\) does not divide n_routed_experts \(256\)"):
        load_model_config("broken", d)
    d = _write(tmp_path, lambda doc: doc["config"].update(num_experts_per_tok=300))
    with pytest.raises(ValueError, match=r"'num_experts_per_tok' \(300\) exceeds"):
        load_model_config("broken", d)
    d = _write(tmp_path, lambda doc: doc["config"].pop("kv_lora_rank"))
    with pytest.raises(ValueError, match=r"missing key 'kv_lora_rank'"):
        load_model_config("broken", d)
    d = _write(tmp_path, lambda doc: doc["source"].pop("url"))
    with pytest.raises(ValueError, match=r"'source' needs 'title', 'url' and 'date'"):
        load_model_config("broken", d)
    with pytest.raises(ValueError, match=r"no file nope\.json.*known: .*deepseek_v3"):
        load_model_config("nope")


def test_params_table():
    t = models.params_table()
    assert list(t.columns)[:2] == ["total_B", "published_total_B"]
    assert t.loc["DeepSeek-V3", "total_B"] == pytest.approx(671.03, abs=0.01)

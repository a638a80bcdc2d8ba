import os

import pytest

from common.core import env


def test_auto_resolves_by_device(monkeypatch):
    monkeypatch.delenv("WORKBOOK_PROFILE", raising=False)
    assert env.resolve_profile("auto", has_gpu=True) == "full"
    assert env.resolve_profile("auto", has_gpu=False) == "quick"
    assert env.resolve_profile("full", has_gpu=False) == "full"


def test_env_override_only_replaces_auto(monkeypatch):
    monkeypatch.setenv("WORKBOOK_PROFILE", "quick")
    assert env.resolve_profile("auto", has_gpu=True) == "quick"
    assert env.resolve_profile("full", has_gpu=True) == "full"


@pytest.mark.parametrize("bad", ["fast", "", "QUICK", None, 3])
def test_unknown_profile_names_value_and_allowed(bad):
    with pytest.raises(ValueError) as e:
        env.resolve_profile(bad, has_gpu=False)
    assert repr(bad) in str(e.value) and "auto, quick, full" in str(e.value)


def test_bad_env_profile(monkeypatch):
    monkeypatch.setenv("WORKBOOK_PROFILE", "turbo")
    with pytest.raises(ValueError, match="WORKBOOK_PROFILE='turbo'"):
        env.resolve_profile("auto", has_gpu=False)


def test_setup_on_cpu_sets_triton_interpreter(capsys):
    e = env.setup("99_test", "quick")
    assert e.profile == "quick" and e.lab == "99_test"
    if e.device == "cpu":
        assert os.environ["TRITON_INTERPRET"] == "1" and e.triton_mode == "interpreted"
        assert e.device_id == "cpu"
    assert "profile quick" in capsys.readouterr().out
    assert e.pick(quick=1, full=2) == (1 if e.quick else 2)


def test_setup_rejects_bad_profile():
    with pytest.raises(ValueError, match="PROFILE='medium'"):
        env.setup("99_test", "medium")


@pytest.mark.parametrize("name,hw", [("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H800", "H800-SXM"),
                                     ("NVIDIA H200", "H200-SXM"), ("NVIDIA A100-SXM4-80GB", "A100-SXM"),
                                     ("NVIDIA B200", "B200"), ("NVIDIA GB200", "GB200"),
                                     ("NVIDIA H100 PCIe", None), ("NVIDIA GeForce RTX 4090", None),
                                     # issue 13: variants get their own entry or none, never a neighbour's
                                     ("NVIDIA H100 NVL", "H100-NVL"), ("NVIDIA H200 NVL", "H200-NVL"),
                                     ("NVIDIA GH200 480GB", None), ("NVIDIA GH200 144G HBM3e", None),
                                     ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA A100-PCIE-40GB", None),
                                     ("NVIDIA A100 80GB PCIe", None), ("NVIDIA H100 80GB HBM3", "H100-SXM")])
def test_identify_gpu(name, hw):
    assert env.identify_gpu(name) == hw


def test_inventory_has_the_basics():
    inv = env.inventory()
    for key in ("python", "cpu_model", "cpu_cores_logical", "memory_gib", "torch", "triton", "triton_mode"):
        assert key in inv


def test_variant_ids_have_sourced_facts():
    """Every id identify_gpu can return is a datasheet GPU or a sourced variant in data/hardware.json."""
    import json
    data = json.loads((env.REPO_ROOT / "data" / "hardware.json").read_text())
    ids = {hw for _, hw in env._GPU_NAME_RULES if hw}
    variants = data["gpu_variants"]
    assert ids <= set(data["gpus"]) | set(variants)
    for vid, v in ((k, v) for k, v in variants.items() if k != "description"):
        assert v["source"] in data["sources"], vid
        assert v["hbm_bandwidth_tbs"] > 0 and v["differs_from"] in data["gpus"]
    assert variants["H100-NVL"]["hbm_bandwidth_tbs"] == 3.9 and variants["A100-40GB"]["hbm_bandwidth_tbs"] == 1.555

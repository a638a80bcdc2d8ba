import os

import pytest

from common import env


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
                                     ("NVIDIA H100 PCIe", None), ("NVIDIA GeForce RTX 4090", None)])
def test_identify_gpu(name, hw):
    assert env.identify_gpu(name) == hw


def test_inventory_has_the_basics():
    inv = env.inventory()
    for key in ("python", "cpu_model", "cpu_cores_logical", "memory_gib", "torch", "triton", "triton_mode"):
        assert key in inv

"""Every fact file in data/ carries its sources: each cited source key exists and names a title or URL and a date."""
import json

import pytest

from common.core.env import REPO_ROOT

FILES = sorted(p for p in (REPO_ROOT / "data").rglob("*.json") if "baselines" not in p.parts)


def _walk(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield path, k, v
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def _valid_source(src: dict) -> bool:
    return bool(src.get("url") or src.get("title")) and bool(src.get("date") or src.get("accessed"))


def test_there_are_fact_files():
    names = {p.name for p in FILES}
    assert {"hardware.json", "systems.json", "claims.json", "deepseek_v3.json"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_sources_are_cited_and_complete(path):
    data = json.loads(path.read_text())
    registry = data.get("sources", {}) if isinstance(data, dict) else {}
    cited = 0
    for where, key, value in _walk(data):
        if key in ("source", "sources") and isinstance(value, str):
            assert value in registry, f"{path.name}{where}: cites source {value!r}, which `sources` does not define"
            cited += 1
        elif key in ("source", "sources") and isinstance(value, list) and all(isinstance(v, str) for v in value):
            missing = [v for v in value if v not in registry]
            assert not missing, f"{path.name}{where}: cites undefined sources {missing}"
            cited += 1
        elif key == "source" and isinstance(value, dict):
            assert _valid_source(value), f"{path.name}{where}.source needs a title or url and a date: {value}"
            cited += 1
    for key, src in registry.items():
        assert isinstance(src, dict) and _valid_source(src), f"{path.name}: source {key!r} needs a title or url and a date"
    assert cited or registry, f"{path.name} cites no source at all"

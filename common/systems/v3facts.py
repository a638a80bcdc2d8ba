"""The facts of DeepSeek-V3's pre-training run (data/deepseek_v3_run.json, each with its source) and its model
config (data/models/deepseek_v3.json): what lab 13's models read. Imported by v3memory and v3model."""
from __future__ import annotations

import json
from functools import lru_cache

from common.core.env import REPO_ROOT
from common.facts import models

RUN_PATH = REPO_ROOT / "data" / "deepseek_v3_run.json"


@lru_cache(maxsize=1)
def load_run() -> dict:
    return json.loads(RUN_PATH.read_text())


def fact(name: str):
    """A fact of the run, e.g. fact("comm_sms") -> 20."""
    facts = load_run()["facts"]
    if name not in facts:
        raise ValueError(f"{name!r} is not a fact in data/deepseek_v3_run.json; recorded: {', '.join(facts)}")
    return facts[name]["value"]


def source(name: str) -> str:
    entry = load_run()["facts"].get(name)
    if entry is None:
        raise ValueError(f"{name!r} is not a fact in data/deepseek_v3_run.json")
    src = load_run()["sources"][entry["source"]]
    return f"{src['title']} ({src['url']}, {src['date']})"


@lru_cache(maxsize=1)
def config():
    return models.load_model_config("deepseek_v3")

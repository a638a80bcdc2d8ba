"""The facts of DeepSeek-V3's pre-training run (data/deepseek_v3_run.json, each with its source) and its model
config (data/models/deepseek_v3.json): what lab 13's models read. Imported by v3memory and v3model."""
from __future__ import annotations

from functools import lru_cache

from common.core.env import REPO_ROOT
from common.facts import models, sourced

RUN_PATH = REPO_ROOT / "data" / "deepseek_v3_run.json"
_RUN = sourced.FactFile(RUN_PATH)


def load_run() -> dict:
    return _RUN.data


def fact(name: str):
    """A fact of the run, e.g. fact("comm_sms") -> 20."""
    return _RUN.fact(name)


def source(name: str) -> str:
    return _RUN.source(name)


@lru_cache(maxsize=1)
def config():
    return models.load_model_config("deepseek_v3")

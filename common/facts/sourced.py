"""Fact files of data/ in the form {"facts": {name: {"value", "unit", "source", "note"}}, "sources": {key: {"title",
"url", "date", "commit"?}}}: `FactFile(path).fact(name)` is the value, `.source(name)` where it comes from.

data/deepseek_v3_run.json (lab 13, `common.systems.v3.facts`) and data/deepseek_v3_service.json (lab 14,
`common.systems.inference.model`) are read through it.
"""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path


class FactFile:
    def __init__(self, path: Path):
        self.path = Path(path)

    @cached_property
    def data(self) -> dict:
        return json.loads(self.path.read_text())

    def fact(self, name: str):
        """The value of fact `name`; an unknown name raises ValueError listing the recorded ones."""
        facts = self.data["facts"]
        if name not in facts:
            raise ValueError(f"{name!r} is not a fact in data/{self.path.name}; recorded: {', '.join(facts)}")
        return facts[name]["value"]

    def source(self, name: str) -> str:
        """'title (url, commit C, date)' of the source fact `name` cites."""
        entry = self.data["facts"].get(name)
        if entry is None:
            raise ValueError(f"{name!r} is not a fact in data/{self.path.name}")
        src = self.data["sources"][entry["source"]]
        commit = f"commit {src['commit']}, " if src.get("commit") else ""
        return f"{src['title']} ({src['url']}, {commit}{src['date']})"

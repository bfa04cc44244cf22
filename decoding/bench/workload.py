"""The built-in agent-style workload: prompts in four categories, shipped as workload.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

CATEGORIES = ("tool", "copy", "summary", "chat")
CONSTRAINED = "constrained"  # tool calls and schema outputs under a grammar: decoding/bench/constrained.py


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    messages: list[dict[str, Any]]


def load_workload(quick: bool = False, categories: tuple[str, ...] | None = None) -> list[BenchPrompt]:
    """All prompts, or two per category with `quick`; optionally only some categories."""
    data = json.loads(resources.files("decoding.bench").joinpath("workload.json").read_text(encoding="utf-8"))
    prompts = [BenchPrompt(p["id"], p["category"], p["messages"]) for p in data["prompts"]]
    wanted = categories or CATEGORIES
    unknown = set(wanted) - set(CATEGORIES)
    if unknown:
        raise ValueError(f"unknown categories {sorted(unknown)} (known: {', '.join(CATEGORIES)})")
    prompts = [p for p in prompts if p.category in wanted]
    if quick:
        prompts = [p for c in wanted for p in [q for q in prompts if q.category == c][:2]]
    return prompts

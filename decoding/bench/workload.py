"""The built-in agent-style workload: prompts in four categories, shipped as workload.json, and, on
request, agent sessions at a long context (long.json, built by long_sessions.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

CATEGORIES = ("tool", "copy", "summary", "chat")
CONSTRAINED = "constrained"  # tool calls and schema outputs under a grammar: decoding/bench/constrained.py
LONG = "long"  # only when asked for: 8 sessions of 1.9k-2.6k tokens (long_sessions.py)


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    messages: list[dict[str, Any]]


def _read(name: str) -> list[BenchPrompt]:
    data = json.loads(resources.files("decoding.bench").joinpath(name).read_text(encoding="utf-8"))
    return [BenchPrompt(p["id"], p["category"], p["messages"]) for p in data["prompts"]]


def load_workload(quick: bool = False, categories: tuple[str, ...] | None = None) -> list[BenchPrompt]:
    """All prompts of the four categories (or of `categories`, `long` among them), or two per category
    with `quick`."""
    wanted = categories or CATEGORIES
    unknown = set(wanted) - {*CATEGORIES, LONG}
    if unknown:
        raise ValueError(f"unknown categories {sorted(unknown)} (known: {', '.join((*CATEGORIES, LONG))})")
    prompts = _read("workload.json") + (_read("long.json") if LONG in wanted else [])
    prompts = [p for p in prompts if p.category in wanted]
    if quick:
        prompts = [p for c in wanted for p in [q for q in prompts if q.category == c][:2]]
    return prompts

"""The project's JSON-schema corpus (`corpus.json`): what the tests and the bench constrain outputs to."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

UNSUPPORTED_PREFIX = "unsupported-"  # entries that use a keyword no backend enforces, to be refused


def load_corpus(include_unsupported: bool = False) -> list[dict[str, Any]]:
    """Entries of {id, prompt, schema[, too_slow_for]}; without the unsupported ones unless asked."""
    text = resources.files("decoding.constraints").joinpath("corpus.json").read_text(encoding="utf-8")
    entries: list[dict[str, Any]] = json.loads(text)["schemas"]
    return entries if include_unsupported else [e for e in entries if not e["id"].startswith(UNSUPPORTED_PREFIX)]

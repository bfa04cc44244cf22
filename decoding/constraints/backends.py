"""Pick a constraint backend by name; one instance per tokenizer (the vocabulary is built once)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from decoding.constraints.base import ConstraintError, GrammarFactory
from decoding.constraints.spec import GrammarSpec
from decoding.tokenizer import Tokenizer

BACKENDS = ("outlines", "xgrammar")


class Backend(Protocol):
    name: str

    def compile(self, spec: GrammarSpec) -> GrammarFactory: ...

    def compile_json_schema(self, schema: dict[str, Any]) -> GrammarFactory: ...


def make_backend(
    name: str, tokenizer: Tokenizer, compile_timeout_s: float | None = None, cache_dir: Path | None = None
) -> Backend:
    """The named backend over `tokenizer`, ending outputs with its end-of-turn token.

    `compile_timeout_s` bounds an outlines compile (xgrammar compiles in milliseconds); `cache_dir`
    keeps outlines' compiled indexes across restarts.
    """
    eos = tokenizer.turn_end_id
    if eos is None:
        raise ConstraintError(f"{tokenizer.source}: no end-of-turn token to close a constrained output")
    if name == "outlines":
        from decoding.constraints.outlines_backend import OutlinesBackend

        return OutlinesBackend(tokenizer, eos, compile_timeout_s, cache_dir)
    if name == "xgrammar":
        from decoding.constraints.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(tokenizer, eos)
    raise ConstraintError(f"unknown constraint backend {name!r} (known: {', '.join(BACKENDS)})")

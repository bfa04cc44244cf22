"""Grammar-constrained decoding: one small protocol, two backends (outlines-core, xgrammar)."""

from decoding.constraints.base import ConstraintError, Grammar, GrammarFactory

__all__ = ["ConstraintError", "Grammar", "GrammarFactory"]

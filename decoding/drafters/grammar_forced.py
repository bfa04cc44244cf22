"""Tokens the grammar forces (JSON keys, quotes, braces after a choice): free drafts, still verified.

Proposed rather than emitted: the target verifies them like any draft (a one-hot q), so the output
distribution stays the target's constrained distribution, with no retokenisation at a jump boundary.
"""

from __future__ import annotations

import torch

from decoding.constraints.base import Grammar
from decoding.drafters.base import Drafter, Proposal
from decoding.sampling import SamplingParams


class GrammarForcedDrafter(Drafter):
    name = "grammar"

    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator,
        grammar: Grammar | None = None,
    ) -> Proposal:
        if grammar is None:
            return Proposal()
        tokens = grammar.forced_tokens(max_tokens)
        return Proposal(tokens=tokens, sources=[self.name] * len(tokens))

"""Tokens the grammar forces (JSON keys, quotes, braces after a choice): free drafts, still verified.

Two kinds: tokens the mask leaves alone (a single allowed token), and — given the tokenizer — the
grammar's forced *text* (`age":` after `"Ann","`, where `a`, `ag` and `age` are all allowed tokens),
tokenized as the tokenizer would and cut to what the grammar allows. Proposed rather than emitted: the
target verifies them like any draft (a one-hot q), so the output distribution stays the target's
constrained distribution, with no retokenisation at a jump boundary; a tokenization the target would
not have chosen is simply rejected.

The tokenizer's own tokenization is not always the target's under a grammar: with compact JSON the
embedded target writes `":` then `"` where the tokenizer has one `":"` token (it learned `": "`). When
the target rejects a forced token and emits a shorter token its text starts with, the drafter learns to
split that token that way for the rest of the request.
"""

from __future__ import annotations

import torch

from decoding.constraints.base import Grammar
from decoding.drafters.base import Drafter, Proposal
from decoding.sampling import SamplingParams
from decoding.tokenizer import Tokenizer


class GrammarForcedDrafter(Drafter):
    name = "grammar"

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self.tokenizer = tokenizer  # None: only the tokens the mask forces
        self.reset()

    def reset(self) -> None:
        self._splits: dict[int, list[int]] = {}  # token -> the tokens the target wrote its text as
        self._last: list[int] = []  # the last proposal, and where in the context it started
        self._last_start = 0
        self._last_accepted: int | None = None

    def observe(self, num_proposed: int, num_accepted: int) -> None:
        self._last_accepted = num_accepted

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
        self._learn_split(context)
        tokens: list[int] = []
        try:
            while len(tokens) < max_tokens:
                step = grammar.forced_tokens(max_tokens - len(tokens)) or self._forced_text_tokens(
                    grammar, max_tokens - len(tokens))
                if not step:
                    break
                for token in step:
                    grammar.accept(token)
                tokens += step
        finally:
            grammar.rollback(len(tokens))
        self._last, self._last_start, self._last_accepted = tokens, len(context), None
        return Proposal(tokens=tokens, sources=[self.name] * len(tokens))

    def _learn_split(self, context: list[int]) -> None:
        """If the target replaced a forced token by a token its text starts with, split it so next time."""
        n = self._last_accepted
        if self.tokenizer is None or n is None or n >= len(self._last) or self._last_start + n >= len(context):
            return
        ours, theirs = self._last[n], context[self._last_start + n]
        text, head = self.tokenizer.decode([ours]), self.tokenizer.decode([theirs])
        if head and len(head) < len(text) and text.startswith(head):
            self._splits[ours] = [theirs, *self.tokenizer.encode(text[len(head):])]

    def _forced_text_tokens(self, grammar: Grammar, limit: int) -> list[int]:
        if self.tokenizer is None:
            return []
        text = grammar.forced_text()
        if not text:
            return []
        ids = self._resplit(self.tokenizer.encode(text))[:limit]
        return ids[: grammar.valid_prefix(ids)]

    def _resplit(self, ids: list[int], depth: int = 3) -> list[int]:
        if not self._splits or depth == 0:
            return ids
        out: list[int] = []
        for token in ids:
            split = self._splits.get(token)
            out += [token] if split is None else self._resplit(split, depth - 1)
        return out

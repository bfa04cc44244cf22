"""Prompt lookup decoding (Saxena 2023; HF `prompt_lookup_num_tokens`, vLLM `ngram`).

Agents copy from their context: find the latest earlier occurrence of the context's last n tokens
(longest n first) and propose what followed it. The index is updated incrementally, so a proposal
costs a dict lookup, not a scan.
"""

from __future__ import annotations

import torch

from decoding.adaptive import DraftLength
from decoding.constraints.base import Grammar
from decoding.drafters.base import Drafter, Proposal
from decoding.sampling import SamplingParams


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, min_n: int = 2, max_n: int = 4, max_tokens: int = 8) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.max_tokens = max_tokens
        self.reset()

    def reset(self) -> None:
        self._forget()
        self.length = DraftLength(self.max_tokens, self.max_tokens, self.costs)

    def _forget(self) -> None:
        self._tokens: list[int] = []
        # n -> {n-gram: end position of its latest occurrence that has a following token}
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(self.min_n, self.max_n + 1)}

    def _sync(self, context: list[int]) -> None:
        known = len(self._tokens)
        if known > len(context) or context[:known] != self._tokens:
            # a context that does not extend the last one (a composite's rejected forced tokens, say): the
            # index is rebuilt; the request's draft length, learned from its acceptance, stays
            self._forget()
            known = 0
        self._tokens = list(context)
        # index every n-gram that ends at a position with a successor: ends in [known - 1, len - 2]
        for end in range(max(known - 1, 0), len(context) - 1):
            for n, table in self._index.items():
                if end + 1 >= n:
                    table[tuple(context[end + 1 - n : end + 1])] = end

    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator,
        grammar: Grammar | None = None,
    ) -> Proposal:
        self._sync(context)
        limit = min(max_tokens, self.length.value)
        size = len(context)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            end = self._index[n].get(tuple(context[size - n :]))
            if end is not None:
                tokens = context[end + 1 : end + 1 + limit]
                if grammar is not None:
                    tokens = tokens[: grammar.valid_prefix(tokens)]
                return Proposal(tokens=tokens, sources=[self.name] * len(tokens))
        return Proposal()

    def observe(self, num_proposed: int, num_accepted: int) -> None:
        self.length.update(num_proposed, num_accepted)

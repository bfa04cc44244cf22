"""Chain drafters: the first proposes what it can, the next continues from there, and so on.

Each token keeps the distribution it was drawn from (one-hot for deterministic drafters), so the
chained proposal is still a valid q for rejection sampling.
"""

from __future__ import annotations

import torch

from decoding.constraints.base import Grammar
from decoding.drafters.base import Drafter, Proposal
from decoding.drafters.group import DrafterGroup
from decoding.sampling import SamplingParams


class CompositeDrafter(DrafterGroup):
    def __init__(self, drafters: list[Drafter]) -> None:
        super().__init__(drafters, "+")
        self._last_split: list[int] = []

    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator,
        grammar: Grammar | None = None,
    ) -> Proposal:
        parts: list[Proposal] = []
        total = 0
        for drafter in self.drafters:
            if total >= max_tokens:
                break
            drafted = [t for p in parts for t in p.tokens]
            part = drafter.propose(context + drafted, max_tokens - total, params, generator, grammar).chain()
            if grammar is not None:  # the next drafter continues from the grammar state after this part
                for token in part.tokens:
                    grammar.accept(token)
            parts.append(part)
            total += len(part)
        if grammar is not None:
            grammar.rollback(total)
        self._last_split = [len(p) for p in parts]
        return _concat(parts)

    def observe(self, num_proposed: int, num_accepted: int) -> None:
        # each drafter hears about its own slice of the proposal
        offset = 0
        for drafter, size in zip(self.drafters, self._last_split, strict=False):
            if size:
                drafter.observe(size, max(0, min(size, num_accepted - offset)))
            offset += size
            if num_accepted < offset:
                break


def _concat(parts: list[Proposal]) -> Proposal:
    tokens = [t for p in parts for t in p.tokens]
    sources = [s for p in parts for s in p.sources]
    dense = [p.probs for p in parts if p.probs is not None]
    probs = None
    if dense:
        vocab = dense[0].shape[-1]
        rows = []
        for p in parts:
            if p.probs is not None:
                rows.append(p.probs)
            elif p.tokens:
                # a deterministic proposal is a one-hot q
                rows.append(torch.nn.functional.one_hot(torch.tensor(p.tokens), vocab).to(dense[0].dtype))
        probs = torch.cat(rows)  # [k, V]
    return Proposal(tokens=tokens, probs=probs, sources=sources, model_drafted=sum(p.model_drafted for p in parts))

"""Alternatives, not a chain: the first drafter with a proposal drafts this pass.

`[ngram, draft]`: where the context has a match, n-gram lookup proposes (free, and long when the agent
copies); elsewhere the draft model does. Chaining the draft after a short n-gram match instead measured
slower (`draftgate bench`): it pays a draft step per n-gram token to catch up, to extend a proposal the
target already cuts short. Every drafter still sees the target's features, so a draft head that sat out
a pass is current when its turn comes.
"""

from __future__ import annotations

import torch

from decoding.constraints.base import Grammar
from decoding.drafters.base import Drafter, Proposal
from decoding.drafters.group import DrafterGroup
from decoding.sampling import SamplingParams


class FallbackDrafter(DrafterGroup):
    def __init__(self, drafters: list[Drafter]) -> None:
        super().__init__(drafters, "|")
        self._chosen: Drafter | None = None

    def reset(self) -> None:
        self._chosen = None
        super().reset()

    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator,
        grammar: Grammar | None = None,
    ) -> Proposal:
        self._chosen = None
        for drafter in self.drafters:
            proposal = drafter.propose(context, max_tokens, params, generator, grammar)
            if len(proposal):
                self._chosen = drafter
                return proposal
        return Proposal()

    def observe(self, num_proposed: int, num_accepted: int) -> None:
        if self._chosen is not None:  # only the drafter that proposed hears how it did
            self._chosen.observe(num_proposed, num_accepted)

    def observe_candidates(self, tried: tuple[int, ...]) -> None:
        if self._chosen is not None:
            self._chosen.observe_candidates(tried)

"""Alternatives, not a chain: the first drafter with a proposal drafts this pass.

`[ngram, draft]`: where the context has a match, n-gram lookup proposes (free, and long when the agent
copies); elsewhere the draft model does. Chaining the draft after a short n-gram match instead measured
slower (`draftgate bench`): it pays a draft step per n-gram token to catch up, to extend a proposal the
target already cuts short. Every drafter still sees the target's features, so a draft head that sat out
a pass is current when its turn comes.

Under sampling (temperature > 0) a model drafter here proposes only with `sampled_models`: off, prompt
lookup alone drafts sampled requests. On the development machine the head's guesses are worth half as
much there (the target's draws leave its argmax) while each still costs a head step, and n-gram lookup
alone measured faster in every bench category (decoding/drafts/README.md, "Sampled requests").
"""

from __future__ import annotations

import torch

from decoding.constraints.base import Grammar
from decoding.drafters.base import Drafter, Proposal
from decoding.drafters.group import DrafterGroup
from decoding.sampling import SamplingParams


class FallbackDrafter(DrafterGroup):
    def __init__(self, drafters: list[Drafter], sampled_models: bool = True) -> None:
        super().__init__(drafters, "|")
        self.sampled_models = sampled_models  # model drafters propose under sampling too
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
            if drafter.cost_per_token > 0 and not (params.greedy or self.sampled_models):
                continue  # a model drafter sits out a sampled request
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

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

Under greedy decoding each model drafter here has a timed gate (`timed`, timed_gate.py): where its
passes earn tokens more slowly than plain steps, by the request's own wall time, it sits out for a
back-off while prompt lookup goes on.
"""

from __future__ import annotations

import torch

from decoding.constraints.base import Grammar
from decoding.drafters.base import Drafter, Proposal
from decoding.drafters.group import DrafterGroup
from decoding.drafters.timed_gate import TimedGate
from decoding.sampling import SamplingParams


class FallbackDrafter(DrafterGroup):
    def __init__(self, drafters: list[Drafter], sampled_models: bool = True, timed: bool = True) -> None:
        super().__init__(drafters, "|")
        self.sampled_models = sampled_models  # model drafters propose under sampling too
        self.timed = timed  # model drafters sit out where their passes are slower than plain steps
        self._chosen: Drafter | None = None
        self._ran: TimedGate | None = None  # the gate of the model drafter that ran this pass
        self._gates: dict[int, TimedGate] = {}

    def reset(self) -> None:
        self._chosen, self._ran = None, None
        self._gates = {i: TimedGate() for i, d in enumerate(self.drafters) if self.timed and d.cost_per_token > 0}
        super().reset()

    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator,
        grammar: Grammar | None = None,
    ) -> Proposal:
        self._chosen, self._ran = None, None
        for i, drafter in enumerate(self.drafters):
            if drafter.cost_per_token > 0 and not (params.greedy or self.sampled_models):
                continue  # a model drafter sits out a sampled request
            gate = self._gates.get(i)
            if gate is not None and not gate.allows():
                continue  # its passes have been slower than plain steps: for now, plain steps
            proposal = drafter.propose(context, max_tokens, params, generator, grammar)
            if gate is not None:
                self._ran = gate
            if len(proposal):
                self._chosen = drafter
                return proposal
        return Proposal()

    def observe(self, num_proposed: int, num_accepted: int) -> None:
        if self._chosen is not None:  # only the drafter that proposed hears how it did
            self._chosen.observe(num_proposed, num_accepted)

    def observe_time(self, seconds: float, tokens: int) -> None:
        if self._ran is not None:  # a model drafter ran: its pass, drafts or not
            self._ran.drafted(tokens, seconds)
        elif self._chosen is None:  # nothing proposed (or the request's controller paused): a plain step
            for gate in self._gates.values():
                gate.plain(seconds)
        self._chosen, self._ran = None, None

    def observe_candidates(self, tried: tuple[int, ...]) -> None:
        if self._chosen is not None:
            self._chosen.observe_candidates(tried)

    @property
    def sat_out(self) -> int:
        """Passes this request where a model drafter was kept out by its gate."""
        return sum(g.sat_out for g in self._gates.values())

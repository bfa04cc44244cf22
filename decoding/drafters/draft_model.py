"""A draft model: any causal LM with the target's tokenizer, run autoregressively with its own KV cache.

Its cache tracks which tokens it holds; after a rejection only the diverging tail is recomputed, since
the static cache rolls back for free.
"""

from __future__ import annotations

import torch

from decoding.adaptive import DraftLength
from decoding.constraints.base import Grammar
from decoding.drafters.base import Drafter, Proposal
from decoding.drafters.chain import draft_chain
from decoding.model import Transformer
from decoding.sampling import SamplingParams


def common_prefix_length(a: list[int], b: list[int], hint: int = 0) -> int:
    """Length of the common prefix of a and b; `hint` is a length known (or likely) to match."""
    hint = min(hint, len(a), len(b))
    if a[:hint] != b[:hint]:
        hint = 0
    n = hint
    limit = min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


class DraftModelDrafter(Drafter):
    name = "draft"

    def __init__(self, model: Transformer, max_tokens: int = 8, cost_per_token: float = 0.1,
                 min_peak: float = 0.0) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.min_peak = min_peak  # stop the chain before a draft the model is less sure of (chain.py)
        self._cost = cost_per_token
        self.reset()

    def reset(self) -> None:
        self._cached: list[int] = []  # tokens whose keys and values are in the draft's cache
        self._committed = 0
        self.length = DraftLength(self.max_tokens, self.max_tokens, self.costs)

    def prepare(self, max_seq_len: int) -> None:
        self.model.setup_cache(max_seq_len)

    @property
    def cost_per_token(self) -> float:
        return self._cost

    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator,
        grammar: Grammar | None = None,
    ) -> Proposal:
        # a draft with a shorter context than the target's drafts nothing past its own (it cannot hold it)
        k = min(max_tokens, self.length.value, self.model.max_seq_len - len(context))
        if k <= 0:
            return Proposal()
        # reuse the cache up to the first differing token; always recompute the last context token
        start = min(common_prefix_length(self._cached, context, self._committed), len(context) - 1)
        logits = self.model(torch.tensor(context[start:]), start, last_only=True)[-1]  # [V]
        self._cached = list(context)
        self._committed = len(context)

        def step(token: int, _: int) -> torch.Tensor:
            out = self.model(torch.tensor([token]), len(self._cached), last_only=True)[-1]  # [V]
            self._cached.append(token)
            return out

        return draft_chain(self.name, logits, k, params, generator, grammar, step, min_peak=self.min_peak)

    def observe(self, num_proposed: int, num_accepted: int) -> None:
        self.length.update(num_proposed, num_accepted)

"""The drafter interface, after HF's CandidateGenerator: `propose` tokens, `observe` how many were kept."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from decoding.constraints.base import Grammar
from decoding.pass_costs import PassCosts
from decoding.sampling import SamplingParams


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    # [k, V] the distribution q each token was drawn from; None when every token is deterministic
    # (one-hot q: n-gram lookup, grammar-forced tokens) or decoding is greedy
    probs: torch.Tensor | None = None
    # [k] which drafter proposed each token
    sources: list[str] = field(default_factory=list)
    # how many of the tokens a model had to run for (the rest were free)
    model_drafted: int = 0
    # a draft tree (decoding/tree.py): each token's parent among the tokens, -1 for the root; None for a
    # chain. Deterministic tree tokens (probs None) are verified by walking the tree; tokens drawn from q
    # (each row its parent's q) by recursive rejection sampling (decoding/tree_sampling.py).
    parents: list[int] | None = None

    def chain(self) -> Proposal:
        """A chain for a caller that cannot verify a tree: the tree's first branch (each node's first
        candidate was drawn from the q it carries)."""
        if self.parents is None:
            return self
        from decoding.tree import TokenTree

        path = TokenTree(self.tokens, self.parents).first_path()
        return Proposal(tokens=[self.tokens[i] for i in path], probs=None if self.probs is None else self.probs[path],
                        sources=[self.sources[i] for i in path], model_drafted=self.model_drafted)

    def __len__(self) -> int:
        return len(self.tokens)


class Drafter(ABC):
    name: str = "drafter"

    @abstractmethod
    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator,
        grammar: Grammar | None = None,
    ) -> Proposal:
        """Up to `max_tokens` tokens likely to follow `context` (prompt + output so far).

        Under a `grammar`, every proposed token is one the grammar allows, and the grammar's state is
        the same on return as on entry."""

    def observe(self, num_proposed: int, num_accepted: int) -> None:  # noqa: B027 - optional hook
        """Feedback after verification: the first `num_accepted` of `num_proposed` tokens were kept."""

    def observe_time(self, seconds: float, tokens: int) -> None:  # noqa: B027 - optional hook
        """After every decode pass, proposal or not: its wall time, from before the proposal to the
        tokens emitted, and how many it emitted."""

    def observe_candidates(self, tried: tuple[int, ...]) -> None:  # noqa: B027 - optional hook
        """After a sampled tree's verification (decoding/tree_sampling.py), before `observe`: the
        candidates tried at each row visited, root first; the last one tried was kept, except at the
        final row."""

    costs: PassCosts | None = None  # this machine's pass costs, once fitted

    def fit(self, costs: PassCosts) -> None:
        """Size proposals by this machine's pass costs from the next request on (drafters with a length
        schedule build their adaptive.DraftLength from `costs` in reset)."""
        self.costs = costs
        self.reset()

    def reset(self) -> None:  # noqa: B027 - optional hook
        """Forget per-request state before a new request."""

    def prepare(self, max_seq_len: int) -> None:  # noqa: B027 - optional hook
        """Make room for sequences of up to `max_seq_len` tokens."""

    @property
    def uses_features(self) -> bool:
        """True when the drafter reads the target's final hidden states (see `observe_features`)."""
        return False

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """Target blocks whose residual stream the drafter reads after the final hidden state (eagle3)."""
        return ()

    def observe_features(self, start: int, features: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """The target's features (T, F) of the verified positions [start, start + T): its final hidden
        states, then the `feature_layers` (`Transformer.forward_hidden`)."""

    @property
    def max_nodes(self) -> int:
        """The most tokens one proposal holds (a tree's nodes can outnumber its depth); 0: max_tokens."""
        return 0

    @property
    def cost_per_token(self) -> float:
        """What proposing one token costs, in target decode steps (0 for a free drafter)."""
        return 0.0

"""Draft with a `DraftHead`: positions whose target features are known run once, in one pass; beyond
them the head chains its own predicted features, one position per step.

The head's cache position i holds the pair (feature of position i, token i + 1). Pairs built from
verified features are kept; pairs built from predicted features (drafts, or tokens another drafter
proposed) are rewritten once the target has verified them — the static cache rolls back for free.

With a `reach`, a catch-up over more than `reach` new pairs (a long prompt) starts the head over from the
latest `reach`: pair i then sits at cache slot and position i - offset. The head attends over less
context from there, and its drafts may differ; outputs never depend on them.
"""

from __future__ import annotations

import torch

from decoding.adaptive import DraftLength
from decoding.constraints.base import Grammar
from decoding.copy_hints import ContextHints
from decoding.draft_head import DraftHead
from decoding.drafters.base import Drafter, Proposal
from decoding.drafters.chain import draft_chain
from decoding.drafters.context_vocab import ContextVocab
from decoding.drafters.draft_model import common_prefix_length
from decoding.drafters.head_tree import TreeShape, grow_tree
from decoding.drafters.head_tree_sampled import grow_sampled_tree
from decoding.drafters.sampled_tree import RETRY_ACCEPTANCE, plan_tree
from decoding.sampling import SamplingParams


class HeadDrafter(Drafter):
    name = "draft"

    def __init__(self, head: DraftHead, max_tokens: int = 8, cost_per_token: float = 0.05,
                 min_peak: float = 0.0, tree: TreeShape | None = None, reach: int | None = None) -> None:
        self.head = head
        # a catch-up longer than `reach` pairs reads only the latest `reach` (None: the whole context)
        self.reach = reach
        self.max_tokens = max_tokens
        self.min_peak = min_peak  # stop the chain before a draft the model is less sure of (chain.py)
        self.tree = tree  # draft a tree (head_tree.py) instead of a chain, where no grammar constrains
        # the last proposal: "chain", "tree" (greedy), "sampled" (a sampled tree), "counted" (a sampled
        # tree whose candidates observe_candidates has counted)
        self._last = "chain"
        self._tree_depth = 0  # the last tree's depth
        self._cost = cost_per_token
        self._features = torch.zeros(0, head.config.feature_width)  # [S, F] the target's, by position
        self.vocab = ContextVocab(head.vocab, head.config.target_vocab_size, head.config.context_vocab)
        self.hints = ContextHints() if head.config.copy_hint else None
        self._tokens: list[int] = []  # the context the head's verified pairs were built from
        self._committed = 0  # pairs [0, committed) were built from verified features
        self._version = -1  # the head's cache_version after this drafter's last step
        self._offset = 0  # the head's cache slot 0 holds the pair of this context position
        self.reset()

    @property
    def uses_features(self) -> bool:
        return self.head.uses_features

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.head.config.feature_layers

    @property
    def cost_per_token(self) -> float:
        return self._cost

    def reset(self) -> None:
        # the verified pairs stay: an agent's next turn extends this one's context, and the pairs of their
        # common prefix are the same (a 2,300-token prompt's catch-up took ~60 ms of head steps); _draft
        # reads them only if no other step touched the head's cache since
        self._known = 0  # target features known for positions [0, known)
        self.length = DraftLength(self.max_tokens, self.max_tokens, self.costs)
        # candidates after the first, kept where the ones before were rejected: a prior worth 4 tries
        self._retry_kept, self._retry_tried = 4 * RETRY_ACCEPTANCE, 4.0
        # how the head's tree scores have predicted this request's accepted tokens: a prior worth 4
        self._tree_kept, self._tree_expected = 4.0, 4.0
        self._tree_scores = 0.0  # the last tree's expected tokens, by its scores
        self.vocab.reset()
        if self.hints is not None:
            self.hints.reset()

    def prepare(self, max_seq_len: int) -> None:
        self.head.setup_cache(max_seq_len)
        if self._features.shape[0] < max_seq_len:  # grown, keeping what it holds (the engine may reuse a
            grown = torch.zeros(max_seq_len, self.head.config.feature_width)  # cached prefix's features)
            grown[: self._features.shape[0]] = self._features
            self._features = grown

    def observe_features(self, start: int, features: torch.Tensor) -> None:
        # features: (T, F) the target's features at positions [start, start + T) (see feature_layers)
        self._features[start : start + features.shape[0]] = features
        self._known = start + features.shape[0]

    def _pair_features(self, start: int, end: int) -> torch.Tensor | None:
        return self._features[start:end] if self.uses_features else None

    def _pair_hints(self, start: int, end: int) -> torch.Tensor | None:
        # pairs [start, end) read tokens start + 1 .. end: the hints after them
        return self.hints.at(start + 1, end + 1) if self.hints is not None else None

    def _path_hint(self, path: list[int]) -> torch.Tensor | None:
        return self.hints.after(path) if self.hints is not None else None

    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator,
        grammar: Grammar | None = None,
    ) -> Proposal:
        k = min(max_tokens, self.length.value)
        last = len(context) - 1  # pairs 0 .. last - 1 precede the first draft
        verified = min(self._known, last) if self.uses_features else last
        if k <= 0 or verified < 1:
            return Proposal()
        proposal = self._draft(context, k, max_tokens, verified, params, generator, grammar)
        self._version = self.head.cache_version  # every head step of this proposal is done
        return proposal

    def _draft(self, context: list[int], k: int, max_tokens: int, verified: int, params: SamplingParams,
               generator: torch.Generator, grammar: Grammar | None) -> Proposal:
        last = len(context) - 1
        if self.head.cache_version != self._version:  # another drafter stepped the head, or a new cache
            self._tokens, self._committed = [], 0
        keep = min(common_prefix_length(self._tokens, context, self._committed) - 1, self._committed)
        keep = max(0, min(keep, verified))
        if keep <= self._offset:  # no kept pair
            keep = self._offset = 0
        if self.reach is not None and verified - keep > self.reach:  # start over from the latest pairs
            keep = self._offset = verified - self.reach
        off = self._offset  # pair i sits at the head's cache slot and position i - off
        ctx = torch.tensor(context)
        self.vocab.update(context)
        if self.hints is not None:
            self.hints.sync(context)
        extra = self.vocab.extra  # (n,) context tokens outside the head's vocabulary, or None
        feature, logits = None, None
        if verified > keep:  # pairs with the target's own features, in one pass
            out, lg = self.head.step(ctx[keep + 1 : verified + 1], self._pair_features(keep, verified), keep - off,
                                     hints=self._pair_hints(keep, verified), extra=extra, last_only=True)
            feature, logits = out[-1:], lg[-1]
        self._tokens, self._committed = list(context[: verified + 1]), verified
        # pairs past the verified features (tokens other drafters proposed), then the drafts themselves
        pos = verified
        if feature is None:  # nothing new was verified: recompute the last verified pair
            pos = verified - 1
            out, lg = self.head.step(ctx[pos + 1 : pos + 2], self._pair_features(pos, pos + 1), pos - off,
                                     hints=self._pair_hints(pos, pos + 1), extra=extra)
            feature, logits, pos = out, lg[-1], verified
        while pos < last:
            out, lg = self.head.step(ctx[pos + 1 : pos + 2], feature, pos - off, hints=self._pair_hints(pos, pos + 1),
                                     extra=extra)
            feature, logits, pos = out, lg[-1], pos + 1
        assert logits is not None
        self._last = "tree" if self.tree is not None and grammar is None and params.greedy else "chain"
        if self.tree is not None and self.tree.sampled and grammar is None and not params.greedy:
            return self._sampled_tree(logits, feature, last - off, max_tokens, params, generator)
        if self._last == "tree":
            assert self.tree is not None
            # fitted to the machine: as many nodes as the chain's ceiling, the pass size that pays here
            fitted = self.costs is not None
            tree, steps = grow_tree(self.head, logits, feature, last - off, self.tree, max_tokens, self.vocab,
                                    self.hints.after if self.hints is not None else None,
                                    max_nodes=self.length.maximum if fitted else None,
                                    keep=self._tree_size if fitted else None)
            self._tree_depth = tree.depth
            return Proposal(tokens=tree.tokens, sources=[self.name] * len(tree), model_drafted=steps + 1,
                            parents=tree.parents)

        path: list[int] = []

        def step(token: int, i: int) -> torch.Tensor:
            nonlocal feature  # each draft reads the feature the head predicted for the one before
            path.append(token)
            feature, lg = self.head.step(torch.tensor([token]), feature, last - off + i, hints=self._path_hint(path),
                                         extra=extra)
            return lg[-1]  # [Vd + n]

        return draft_chain(self.name, logits, k, params, generator, grammar, step, self.vocab.ids,
                           self.head.config.target_vocab_size, self.min_peak)

    def _tree_size(self, scores: list[float]) -> int:
        """How many of a greedy tree's best nodes a pass verifies, given their scores (decreasing). A node's
        score, the head's probability of its path, is its chance of being accepted were the head right;
        scaled by how the scores have predicted this request's accepted tokens, it is the tokens the node
        adds. The pass size with the most expected tokens per unit of cost (PassCosts.best_size) — none,
        for a plain step, where the head is too unsure for its rows to pay."""
        assert self.costs is not None
        scale = self._tree_kept / self._tree_expected
        size = self.costs.best_size([scale * s for s in scores]) - 1
        self._tree_scores = sum(scores[:size])
        return size

    def _sampled_tree(self, logits: torch.Tensor, feature: torch.Tensor, last: int, max_tokens: int,
                      params: SamplingParams, generator: torch.Generator) -> Proposal:
        """Under sampling: the plan's shape at this request's acceptance so far, each node's candidates
        drawn from its q (head_tree_sampled.py)."""
        assert self.tree is not None
        a, retry, depth = self.length.acceptance, self._retry_kept / self._retry_tried, max_tokens
        nodes = self.tree.nodes
        if self.costs is not None:  # fitted: as many nodes as pay on this machine, up to its largest pass
            largest = plan_tree(min(len(self.costs.relative) - 1, self.max_nodes), depth, a, retry, self.tree.branch)
            nodes = self.costs.best_size(largest.gains) - 1
        plan = plan_tree(nodes, depth, a, retry, self.tree.branch)
        tree, probs, steps = grow_sampled_tree(self.head, logits, feature, last, plan, params, self.vocab, generator,
                                               self.hints.after if self.hints is not None else None, self.min_peak)
        self._tree_depth = tree.depth
        self._last = "sampled"
        return Proposal(tokens=tree.tokens, probs=probs, sources=[self.name] * len(tree), model_drafted=steps + 1,
                        parents=tree.parents)

    def observe_candidates(self, tried: tuple[int, ...]) -> None:
        # the first candidate of each row visited was kept or missed; later ones tell the retry rate
        for i, count in enumerate(tried):
            if count == 0:
                continue
            kept = i + 1 < len(tried)  # the row's last candidate tried was kept
            self.length.record(int(kept and count == 1), int(count > 1 or not kept))
            self._retry_tried += count - 1
            self._retry_kept += int(kept and count > 1)
        self._last = "counted"

    @property
    def max_nodes(self) -> int:
        if self.tree is None:
            return self.max_tokens
        # a fitted sampled tree grows to the largest pass that pays, up to a chain's drafts
        return max(self.tree.nodes, self.max_tokens) if self.tree.sampled else self.tree.nodes

    def observe(self, num_proposed: int, num_accepted: int) -> None:
        if self._last == "sampled":  # verified as a chain (a composite chains its first path): its first
            self.length.record(num_accepted, int(num_accepted < num_proposed))  # candidates, kept or not
        elif self._last == "tree":  # a tree's size does not follow the chain's schedule; its acceptance counts
            self.length.record(num_accepted, num_accepted < self._tree_depth)
            self._tree_kept += num_accepted
            self._tree_expected += self._tree_scores
        elif self._last == "chain":
            self.length.update(num_proposed, num_accepted)
        # "counted": observe_candidates already counted every candidate of the sampled tree

"""Grow a sampled draft tree with a draft head: the shape comes first (sampled_tree.plan_tree), then the
head runs depth by depth over the nodes the plan expands (one step per depth, as head_tree.grow_tree),
and each node's candidates are drawn from its q without replacement, in rank order. Every node carries
the q it was drawn from, for recursive rejection sampling (decoding/tree_sampling.py).

A node gets no candidates where its q peaks below `min_peak` (the chain's confidence cut, chain.py): a
rule on the distribution, never on a drawn token, so the draws stay exact.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from decoding.draft_head import DraftHead
from decoding.drafters.context_vocab import ContextVocab
from decoding.drafters.head_tree import Node, expand_nodes
from decoding.drafters.sampled_tree import TreePlan
from decoding.sampling import SamplingParams, processed_probs
from decoding.tree import TokenTree
from decoding.tree_sampling import draw_without_replacement


def grow_sampled_tree(head: DraftHead, logits: torch.Tensor, feature: torch.Tensor, last: int, plan: TreePlan,
                      params: SamplingParams, vocab: ContextVocab, generator: torch.Generator,
                      hint: Callable[[list[int]], torch.Tensor] | None = None,
                      min_peak: float = 0.0) -> tuple[TokenTree, torch.Tensor, int]:
    """logits: (Vd + n,) the head's for the first draft, over `vocab.ids`; feature: (1, D) its predicted
    feature of the position before; the drafts start at position and cache slot `last`; params: not greedy.
    -> (tree, q (N, V) each node was drawn from, head steps run)."""
    ids = vocab.ids  # (Vd + n,) target ids
    width = head.config.target_vocab_size
    nodes: list[Node] = []
    drawn_from: list[torch.Tensor] = []  # [N] (V,) each node's q
    planned: list[int] = []  # [N] each node's index in the plan
    kids = [[i for i, p in enumerate(plan.parents) if p == parent] for parent in range(-1, len(plan.parents))]

    def draw(q: torch.Tensor, at: int, parent: int, depth: int) -> None:
        # q: (Vd + n,) the distribution after plan node `at` (-1: the root), drawn as node `parent`
        wanted = kids[at + 1]  # the plan's candidates here, in rank order
        if not wanted or (min_peak > 0 and float(q.max()) < min_peak):
            return
        wide = torch.zeros(width, dtype=q.dtype).index_copy_(0, ids, q)  # (V,)
        for plan_node, j in zip(wanted, draw_without_replacement(q, len(wanted), generator), strict=False):
            nodes.append(Node(int(ids[j]), parent, depth, 0.0))
            drawn_from.append(wide)
            planned.append(plan_node)

    draw(processed_probs(logits.unsqueeze(0), params)[0], -1, -1, 1)
    slot, steps, depth = last, 0, 1
    while True:
        expand = [i for i, n in enumerate(nodes) if n.depth == depth and kids[planned[i] + 1]]
        if not expand or slot + len(expand) > head.max_seq_len:
            break
        lg = expand_nodes(head, nodes, expand, slot, last, depth, feature, vocab, hint)  # (W, Vd + n)
        steps += 1
        slot += len(expand)
        q = processed_probs(lg, params)  # (W, Vd + n)
        for r, i in enumerate(expand):
            draw(q[r], planned[i], i, depth + 1)
        depth += 1
    tree = TokenTree([n.token for n in nodes], [n.parent for n in nodes])
    probs = torch.stack(drawn_from) if drawn_from else torch.zeros(0, width)  # (N, V)
    return tree, probs, steps

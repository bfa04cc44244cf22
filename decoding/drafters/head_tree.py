"""Grow a draft tree with a draft head, after EAGLE-2: expand the most likely nodes depth by depth, keep
the most likely nodes overall.

A node's score is the product of the head's probabilities along its path (its chance of acceptance if
the head were right about the target). Each depth, the `width` best unexpanded nodes of the last depth
run through the head in one step (each row reads the context and its own ancestors) and each gets its
`branch` most likely tokens as children. Expansion stops at `depth`, or when no node of the last depth
scores at least `min_score`. The `nodes` best-scoring nodes make the tree: a child never scores above
its parent, so the selection keeps every chosen node's ancestors.

That is the greedy tree. Under sampling the head draws its tree instead (head_tree_sampled.py), with
the same `nodes` and `branch` bounds; `expand_nodes` is the head step both run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from decoding.draft_head import DraftHead
from decoding.drafters.context_vocab import ContextVocab
from decoding.tree import TokenTree


@dataclass(frozen=True)
class TreeShape:
    """The default is the best of a side-by-side sweep on the quick workload (greedy, 2 cores, v3 head):
    on a CPU each verified node costs target compute, so a narrow tree (one path expanded per depth,
    four alternatives at each) beats both the chain and wide trees; see decoding/drafts/README.md."""

    nodes: int = 6  # nodes verified per pass
    branch: int = 4  # children of an expanded node
    width: int = 1  # nodes expanded per depth
    depth: int = 5  # deepest node
    min_score: float = 0.2  # expand a depth only if its best node scores at least this
    # under sampling: draw a tree from the head's q (head_tree_sampled.py), else draft the chain. The
    # chain measured faster at T=0.7 on both 2-core machines (decoding/drafts/README.md, ninth session):
    # a sampled tree keeps as many tokens a pass, in bigger passes and more head steps
    sampled: bool = False


@dataclass(eq=False)
class Node:
    token: int
    parent: int  # -1: the root
    depth: int
    score: float
    slot: int = -1  # the head's cache slot, once expanded
    feature: torch.Tensor | None = None  # (1, D) the head's predicted feature, once expanded


def _feature(node: Node) -> torch.Tensor:
    assert node.feature is not None, "a parent is expanded before its children"
    return node.feature  # (1, D)


def _path(nodes: list[Node], node: Node) -> list[int]:
    """The draft tokens from the root's first child down to `node`."""
    path = [node.token]
    while node.parent >= 0:
        node = nodes[node.parent]
        path.append(node.token)
    return path[::-1]


def expand_nodes(head: DraftHead, nodes: list[Node], expand: list[int], slot: int, last: int, depth: int,
                 feature: torch.Tensor, vocab: ContextVocab,
                 hint: Callable[[list[int]], torch.Tensor] | None) -> torch.Tensor:
    """One head step over the nodes `expand` (indices into `nodes`, all `depth` deep), written at cache
    slots [slot, slot + W); each row reads the context [0, last) and its own ancestors. `feature` (1, D)
    is the root's. Each node keeps its predicted feature (1, D) for its children's step. -> logits
    (W, Vd + n) for each node's children."""
    rows = [nodes[i] for i in expand]
    mask = torch.zeros(len(rows), slot + len(rows), dtype=torch.bool)  # (W, slot + W)
    mask[:, :last] = True  # the context
    for r, node in enumerate(rows):
        node.slot = slot + r
        a: Node | None = node
        while a is not None:  # the node and its ancestors
            mask[r, a.slot] = True
            a = nodes[a.parent] if a.parent >= 0 else None
    parents = torch.cat([feature if n.parent < 0 else _feature(nodes[n.parent]) for n in rows])  # (W, D)
    tokens = torch.tensor([n.token for n in rows])  # (W,)
    hints = torch.cat([hint(_path(nodes, n)) for n in rows]) if hint is not None else None  # (W, 2)
    positions = torch.full((len(rows),), last + depth - 1)  # (W,)
    out, lg = head.step(tokens, parents, slot, positions, mask, hints, vocab.extra)  # (W, D), (W, Vd + n)
    for r, node in enumerate(rows):
        node.feature = out[r : r + 1]
    return lg


def grow_tree(head: DraftHead, logits: torch.Tensor, feature: torch.Tensor, last: int, shape: TreeShape,
              max_depth: int, vocab: ContextVocab,
              hint: Callable[[list[int]], torch.Tensor] | None = None,
              max_nodes: int | None = None,
              keep: Callable[[list[float]], int] | None = None) -> tuple[TokenTree, int]:
    """logits: (Vd + n,) the head's for the first draft, over `vocab.ids`; feature: (1, D) its predicted
    feature of the position before; the drafts start at position and cache slot `last`. `hint` gives
    the copy hint (1, 2) after a path of draft tokens, for heads that read one. `max_nodes` caps the
    shape's nodes (and so its depth): what a pass can carry and pay for on this machine (DraftLength).
    `keep` says how many of the best nodes (their scores, decreasing) the pass verifies; without it, all
    up to the cap. -> (tree, head steps run)."""
    nodes_cap = shape.nodes if max_nodes is None else min(shape.nodes, max_nodes)
    max_depth = min(max_depth, nodes_cap)
    ids = vocab.ids
    nodes: list[Node] = []
    probs = torch.softmax(logits.float(), dim=-1)  # (Vd,) the head's distribution
    top = torch.topk(probs, shape.branch)
    frontier: list[int] = []
    for p, j in zip(top.values.tolist(), top.indices.tolist(), strict=True):
        if p > 0:
            nodes.append(Node(int(ids[j]), -1, 1, p))
            frontier.append(len(nodes) - 1)
    slot, steps = last, 0
    depth_limit = min(shape.depth, max_depth)
    for depth in range(1, depth_limit):
        frontier = sorted(frontier, key=lambda i: -nodes[i].score)[: shape.width]
        if not frontier or nodes[frontier[0]].score < shape.min_score or slot + len(frontier) > head.max_seq_len:
            break
        expanded = frontier
        lg = expand_nodes(head, nodes, expanded, slot, last, depth, feature, vocab, hint)  # (W, Vd + n)
        steps += 1
        slot += len(expanded)
        probs = torch.softmax(lg.float(), dim=-1)  # (W, Vd)
        top = torch.topk(probs, shape.branch, dim=-1)
        frontier = []
        for r, i in enumerate(expanded):
            for p, j in zip(top.values[r].tolist(), top.indices[r].tolist(), strict=True):
                if p > 0:
                    nodes.append(Node(int(ids[j]), i, depth + 1, nodes[i].score * p))
                    frontier.append(len(nodes) - 1)
    # the best nodes; ties go to the shallower (so a parent before a child with its score), then older
    ranked = sorted(range(len(nodes)), key=lambda i: (-nodes[i].score, nodes[i].depth, i))
    chosen = ranked[:nodes_cap]
    if keep is not None:
        chosen = chosen[: keep([nodes[i].score for i in chosen])]
    order = sorted(chosen, key=lambda i: (nodes[i].depth, i))  # breadth first: parents before children
    renumber = {old: new for new, old in enumerate(order)}
    tokens_out = [nodes[i].token for i in order]
    parents_out = [-1 if nodes[i].parent < 0 else renumber[nodes[i].parent] for i in order]
    return TokenTree(tokens_out, parents_out), steps

"""The shape of a sampled draft tree: how many candidates each node gets, from how often candidates are
kept, before any is drawn (decoding/tree_sampling.py: a node's candidate count must not depend on the
candidates' own values).

After Sequoia (Chen et al. 2024): where the i-th candidate of any node is kept with probability f(i)
given its parent was, a node reached along candidates (i1, ..., id) is kept with probability
f(i1) ... f(id), and the tree of N nodes that keeps most tokens in expectation is the N paths with the
largest products; every prefix of a chosen path is chosen too (f <= 1), so they make a tree. Here
f(1) = a, the chance the first candidate is kept (1 - TV(p, q) under sampling), and a later candidate,
tried only where the ones before it were rejected, f(i) = (1 - a) (1 - r)^(i - 2) r, with r the chance
it is kept against the residual.

Measured on the bench workload at temperature 0.7 (per node, first draft of each pass): a = 0.50, and
two / three / four candidates keep 0.61 / 0.67 / 0.70 — r ~ 0.23 for the second, less for the next.
At that a a chain's sixth draft is kept with probability 0.016, the root's second candidate 0.11: the
best tree of 6 is wide near the root.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from decoding.tree import depths_of

# the chance that a candidate other than the first is kept where the ones before it were rejected, before a
# request has tried any (its own count takes over: HeadDrafter)
RETRY_ACCEPTANCE = 0.2


@dataclass(frozen=True)
class TreePlan:
    parents: list[int]  # [N] each node's parent in the plan, -1 for the root; parents come first
    ranks: list[int]  # [N] which candidate of its parent the node is: 1 is drawn first
    gains: list[float]  # [N] the chance each chosen node is reached and kept, best first (not node order)

    @property
    def depths(self) -> list[int]:
        return depths_of(self.parents)


def plan_tree(nodes: int, depth: int, acceptance: float, retry: float = RETRY_ACCEPTANCE,
              branch: int = 4) -> TreePlan:
    """The `nodes` most likely kept candidate paths, at most `depth` deep and `branch` candidates per node,
    in breadth-first order (by depth, then parent, then rank)."""
    a, r = min(max(acceptance, 1e-6), 1 - 1e-6), min(max(retry, 0.0), 1 - 1e-6)

    def keep(rank: int) -> float:
        return a if rank == 1 else (1 - a) * (1 - r) ** (rank - 2) * r

    # best first over slots (value, parent's chosen index, rank, depth): choosing a slot opens its next
    # sibling and its first child, whose values are no larger
    chosen: list[tuple[int, int, int]] = []  # (parent's chosen index, rank, depth)
    heap: list[tuple[float, int, int, int, int]] = [(-keep(1), 1, 0, -1, 1)]  # (-value, depth, order, parent, rank)
    values: list[float] = []
    order = 1
    while heap and len(chosen) < nodes:
        neg, d, _, parent, rank = heapq.heappop(heap)
        chosen.append((parent, rank, d))
        values.append(-neg)
        me = len(chosen) - 1
        base = values[parent] if parent >= 0 else 1.0
        if rank < branch:
            heapq.heappush(heap, (-base * keep(rank + 1), d, order, parent, rank + 1))
            order += 1
        if d < depth:
            heapq.heappush(heap, (-values[me] * keep(1), d + 1, order, me, 1))
            order += 1
    # breadth first, as the tree is drafted: depth by depth, each parent's candidates (parents in their
    # own order) in rank order
    renumber = {-1: -1}
    for d in range(1, depth + 1):
        level = [i for i, c in enumerate(chosen) if c[2] == d]
        level.sort(key=lambda i: (renumber[chosen[i][0]], chosen[i][1]))
        for i in level:
            renumber[i] = len(renumber) - 1
    ranked = sorted(range(len(chosen)), key=lambda i: renumber[i])
    return TreePlan([renumber[chosen[i][0]] for i in ranked], [chosen[i][1] for i in ranked], values)

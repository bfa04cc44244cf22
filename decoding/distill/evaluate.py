"""Offline measures of a draft head on held-out sequences: how many drafts a greedy chain would get
accepted, per category, and what one draft step costs next to one target step."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import Any

import torch

from decoding.distill.data import Sequence
from decoding.distill.train import bucketed_scores, context_extra, head_features, scored_ids, vocab_index
from decoding.distill.unroll import unrolled
from decoding.draft_head import DraftHead
from decoding.model import Transformer


@torch.no_grad()
def chain_acceptance(head: DraftHead, seq: Sequence, depth: int) -> list[int]:
    """Accepted drafts (0 .. depth) of a greedy chain starting after every generated position.

    Draft u of the chain whose verified features end at position L-1 is step u's prediction at pair
    L-1+u; it is accepted when it is the target's top-1 there and the earlier drafts were accepted
    (and the sequence continued with that token, so the next step read what decoding would)."""
    assert seq.top_ids is not None and seq.features is not None
    p, n = seq.prompt_len, seq.tokens.shape[0] - 1
    steps = depth if head.uses_features else 1
    outputs = unrolled(head, seq.tokens, head_features(head, seq) if head.uses_features else None, steps)
    extra = context_extra(head, vocab_index(head), seq.tokens)  # (n,) context tokens it scores too, or None
    ids = scored_ids(head, extra)  # (Vd + n,)
    top1 = seq.top_ids[p - 1 :, 0].long()  # target's top-1 after positions p-1 .. T-1
    ok: list[torch.Tensor] = []  # ok[u][j]: step u is right at pair j (j >= p - 2)
    for u in range(depth):
        predicted = outputs[min(u, steps - 1)][p - 2 :]  # (n - p + 2, D) pairs p-2 .. n-1
        guess = ids[bucketed_scores(head, predicted, extra).argmax(-1)]  # (n - p + 2,)
        want = top1  # (n - p + 2,) the target's top-1 at positions p-1 .. n, what pairs p-2 .. n-1 predict
        followed = torch.ones_like(guess, dtype=torch.bool)
        followed[: n - p + 1] = seq.tokens[p:] == want[: n - p + 1]  # the token fed next was that top-1
        ok.append((guess == want) & followed)
    lengths = []
    for start in range(p, n + 1):  # chains after the prompt's first generated token .. the last position
        accepted = 0
        for u in range(depth):
            j = start - 1 + u - (p - 2)
            if j >= ok[u].shape[0] or not bool(ok[u][j]):
                break
            accepted += 1
        lengths.append(accepted)
    return lengths


def evaluate(head: DraftHead, held_out: list[Sequence], depth: int = 8) -> dict[str, Any]:
    """Mean accepted drafts per chain and mean acceptance length (1 + accepted), overall and per category."""
    head.eval()
    by_category: dict[str, list[int]] = defaultdict(list)
    for seq in held_out:
        by_category[seq.category] += chain_acceptance(head, seq, depth)
    everything = [x for v in by_category.values() for x in v]

    def summary(xs: list[int]) -> dict[str, float]:
        mean = sum(xs) / max(1, len(xs))
        return {"chains": len(xs), "mean_accepted": round(mean, 3), "mean_acceptance_length": round(1 + mean, 3),
                "first_draft_accepted": round(sum(1 for x in xs if x > 0) / max(1, len(xs)), 3)}

    return {"depth": depth, "all": summary(everything),
            "categories": {c: summary(v) for c, v in sorted(by_category.items())}}


@torch.inference_mode()
def step_cost(head: DraftHead, target: Transformer, repeats: int = 50) -> dict[str, float]:
    """Milliseconds of one single-token draft step and one target decode step, and their ratio: medians
    of calls taken in turn, so that a drift of the machine's speed moves both alike."""
    head.setup_cache(64)
    target.setup_cache(64)
    feature = torch.zeros(1, head.config.dim)
    token = torch.tensor([1])

    def draft() -> Any:
        return head.step(token, feature if head.uses_features else None, 10, hints=torch.zeros(1, 2, dtype=torch.int64))

    def step() -> Any:
        return target(token, 10)

    times: dict[Any, list[float]] = {draft: [], step: []}
    for i in range(5 + repeats):
        for fn, taken in times.items():
            started = time.perf_counter()
            fn()
            if i >= 5:  # the first calls warm up
                taken.append((time.perf_counter() - started) * 1000)
    draft_ms, target_ms = (statistics.median(t) for t in times.values())
    return {"draft_step_ms": round(draft_ms, 3), "target_step_ms": round(target_ms, 3),
            "relative_cost": round(draft_ms / target_ms, 4)}

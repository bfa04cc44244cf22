"""The draft loop both model drafters share: up to k tokens from a model's logits, each drawn from the
same masked, processed distribution the verifier will use for q (argmax when greedy), the grammar
advanced over them and rolled back at the end (the engine re-advances over what the target accepts).

The chain stops early where the model is unsure: before drawing a draft whose distribution's peak (its
most likely token's probability, after the mask and sampling processing) is below `min_peak`. The rule
reads the distribution, never the token drawn from it, so every token proposed is still a plain sample
of q and rejection sampling stays exact; it only saves verifying drafts that would mostly be rejected."""

from __future__ import annotations

from collections.abc import Callable

import torch

from decoding.constraints.base import Grammar
from decoding.drafters.base import Proposal
from decoding.sampling import SamplingParams, processed_probs


def draft_chain(
    name: str,
    logits: torch.Tensor,  # [V] the model's logits for the first draft
    k: int,
    params: SamplingParams,
    generator: torch.Generator,
    grammar: Grammar | None,
    step: Callable[[int, int], torch.Tensor],  # (token, i) -> [V] logits for draft i + 1
    can_emit: torch.Tensor | None = None,  # [V] bool: tokens the model can propose at all (None: every token)
    min_peak: float = 0.0,  # stop before a draft whose distribution peaks below this
) -> Proposal:
    tokens: list[int] = []
    rows: list[torch.Tensor] = []
    for i in range(k):
        allowed = grammar.allowed_mask() if grammar is not None else None  # [V]
        if allowed is not None and can_emit is not None and not bool((allowed & can_emit).any()):
            break  # the grammar wants a token this model cannot emit
        if params.greedy:
            masked = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))  # [V]
            if min_peak > 0 and float(torch.softmax(masked.float(), dim=-1).max()) < min_peak:
                break
            token = int(masked.argmax().item())
        else:
            mask = None if allowed is None else allowed.unsqueeze(0)
            q = processed_probs(logits.unsqueeze(0), params, mask)[0]  # [V]
            if min_peak > 0 and float(q.max()) < min_peak:
                break
            token = int(torch.multinomial(q, 1, generator=generator).item())
            rows.append(q)
        tokens.append(token)
        if grammar is not None:
            grammar.accept(token)
        if i + 1 < k:
            logits = step(token, i)
    if grammar is not None:
        grammar.rollback(len(tokens))
    probs = torch.stack(rows) if rows else None  # [k, V]
    return Proposal(tokens=tokens, probs=probs, sources=[name] * len(tokens), model_drafted=len(tokens))

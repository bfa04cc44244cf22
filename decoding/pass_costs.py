"""What a target pass of r rows costs on this machine, and how many drafts a pass should carry.

Speculation trades one pass of 1 + k rows (the last token and k drafts) for up to k + 1 tokens, so it
pays by how little more that pass costs than a single step — and that is the machine's, not the
model's: on the 2-core development CPU (AVX-512 BF16) a pass of 9 rows of the embedded model costs
~1.2 steps, so long proposals pay; on a 2-core AVX2 machine in float32, 2–4 rows cost ~1.05–1.15 steps
and 5–8 rows ~1.5 (decoding/packing.py), so a pass of 3 drafts pays more than one of 8 unless the
drafts are nearly sure (copying). `draftgate` measures the curve once per model at load (up to seven
passes of each size, timed in turn, ~4 s past the first round at most: ~5 s for the embedded model),
and each request's drafters cap their proposals where the expected tokens per unit of cost peak at the
acceptance that request has seen (adaptive.DraftLength; decoding/drafts/README.md, "An AVX2 machine").
Which tokens come out never depends on it: only how many a pass proposes.
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass

import torch

from decoding.model import Transformer

log = logging.getLogger(__name__)

# the chance that a draft is kept, given that the one before it was: ~0.7 on the bench workload (a chain
# of 8 accepts 2.4-2.7 tokens a pass); only where the curve bends does the choice depend on it
REFERENCE_ACCEPTANCE = 0.7
MAX_ROWS = 9  # the root and 8 drafts: the policy's default max_draft_tokens
CLEAR_GAIN = 1.05  # a smaller pass size must be expected to earn 5% more than the largest to be chosen

_measured: weakref.WeakKeyDictionary[Transformer, PassCosts] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class PassCosts:
    relative: tuple[float, ...]  # [R] a pass of r rows in units of a one-row step, r = 1..R; non-decreasing

    def __post_init__(self) -> None:
        if not self.relative or self.relative[0] != 1.0:
            raise ValueError(f"relative costs start at 1.0 for one row, got {self.relative}")

    def best_rows(self, acceptance: float = REFERENCE_ACCEPTANCE) -> int:
        """The pass size r (1 + drafts) of a chain with the most expected tokens per unit of cost, each
        draft kept with probability `acceptance` given the one before: draft i adds a^i tokens, E(r) =
        (1 - a^r) / (1 - a) (Leviathan et al. 2023, section 3.4)."""
        return self.best_size([acceptance**i for i in range(1, len(self.relative))])

    def best_size(self, gains: list[float]) -> int:
        """The pass size r with the most expected tokens per unit of cost, where the pass's i-th draft adds
        gains[i - 1] tokens (non-increasing: the chance it is reached and kept), the target's own token
        one: (1 + gains[0] + ... + gains[r - 2]) / cost(r). The largest measured size unless a smaller
        one is expected to earn CLEAR_GAIN more: the costs are timings on a shared machine, and the
        largest size is what the shipped defaults were tuned at where passes are cheap."""
        largest = min(len(self.relative), len(gains) + 1)
        tokens = [1.0]
        for g in gains[: largest - 1]:
            tokens.append(tokens[-1] + g)

        def rate(r: int) -> float:
            return tokens[r - 1] / self.relative[r - 1]

        best = max(range(1, largest + 1), key=lambda r: (round(rate(r), 6), -r))
        return best if rate(best) > CLEAR_GAIN * rate(largest) else largest

    def __str__(self) -> str:
        return " / ".join(f"{c:.2f}" for c in self.relative)


def relative_costs(rounds: list[list[float]]) -> PassCosts:
    """Costs from timed rounds, rounds[i][r - 1] the seconds of round i's pass of r rows: each round's
    passes relative to its own one-row pass, each size's (lower) median over the rounds, made non-decreasing.

    Paired within a round (its passes follow one another within ~0.1 s) because the machine's speed
    moves in phases: on the 2-core development machine a step took 4.6 ms in one second and 6.0 in
    another, and the fastest of each size — what this took before — priced 9 rows at 1.53 steps in one
    load and 1.21 in the next, where the passes' median cost was 1.30. The median over rounds drops a
    pass a busy moment slowed (on the AVX2 machine single passes spiked from 43 to 129 ms)."""
    sizes = len(rounds[0])
    ratios = [sorted(times[r] / times[0] for times in rounds) for r in range(sizes)]
    medians = [v[(len(v) - 1) // 2] for v in ratios]  # the lower median: of 4 rounds, 2 may be off
    # a pass never costs more than a bigger one: each size takes the least of its own and the bigger
    # sizes' (3 rows run padded to 4, say: noise must not price 3 above 4)
    relative = [max(1.0, round(min(medians[r:]), 3)) for r in range(sizes)]
    relative[0] = 1.0
    return PassCosts(tuple(relative))


def measure_pass_costs(model: Transformer, max_rows: int = MAX_ROWS, context: int = 256,
                       repeats: int = 8, budget_s: float = 4.0) -> PassCosts:
    """Time passes of 1..max_rows rows at a `context`-token cache, in turn (smallest first, then largest
    first, round after round), up to `repeats` rounds after a warm-up round, and no more rounds once
    `budget_s` is spent (at least one: a big model's load is not held up by a minute of timing); their
    costs as `relative_costs` reads them. Leaves the model's KV cache holding random tokens (every
    request starts with its own prefill)."""
    context = max(1, min(context, model.args.max_seq_len - max_rows))  # a model with a short context
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.args.vocab_size, (context + max_rows,), generator=g)  # (context + R,)
    model.setup_cache(context + max_rows)
    model(tokens[:context], 0)
    rounds: list[list[float]] = []
    began = time.perf_counter()
    for round_ in range(repeats + 1):
        if round_ > 1 and time.perf_counter() - began > budget_s:
            break
        times = [0.0] * max_rows
        sizes = range(1, max_rows + 1)
        for r in sizes if round_ % 2 else reversed(sizes):  # up, then down: no size always follows another
            start = time.perf_counter()
            model(tokens[context : context + r], context)  # (r, V)
            times[r - 1] = time.perf_counter() - start
        if round_ > 0:
            rounds.append(times)
    return relative_costs(rounds)


def pass_costs(model: Transformer) -> PassCosts:
    """This machine's costs for `model`, measured on first use and kept for the model's lifetime."""
    costs = _measured.get(model)
    if costs is None:
        costs = measure_pass_costs(model)
        _measured[model] = costs
        log.info("target passes of 1..%d rows cost %s steps here: %d rows a pass pay best", len(costs.relative),
                 costs, costs.best_rows())
    return costs

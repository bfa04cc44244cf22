"""When to speculate, and how far: per-request draft length and an on/off controller.

Draft length follows HF transformers' heuristic schedule: +2 after a pass where every draft was
accepted, else -1, never below 1. The controller compares what speculation earned (tokens per verify
pass) with what it cost under a simple cost model — a verify pass of k drafts costs (1 + verify_cost *
k) target steps, plus draft_cost * k for a drafter that runs a model — and pauses speculation when it
does not pay, probing again after a back-off. Decisions use counts only, never wall time, so a request
behaves the same on a loaded machine. (Pricing it by costs measured at load instead lost 3–5% greedy
here; behind prompt lookup, whether a model drafter pays is judged by the request's own wall time:
drafters/timed_gate.py.)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from decoding.pass_costs import REFERENCE_ACCEPTANCE, PassCosts


class DraftLength:
    """The HF heuristic schedule for one request. With this machine's pass costs, its ceiling is the
    proposal size that pays best at the acceptance this request has seen so far (PassCosts.best_rows):
    long where prompt lookup copies, short where drafts miss, on a machine where big passes cost more."""

    def __init__(self, initial: int, maximum: int, costs: PassCosts | None = None) -> None:
        self.limit = maximum  # the hard bound
        self.costs = costs
        # drafts kept and misses (passes that rejected one), from a prior worth four drafts at the reference
        self._kept, self._missed = 4 * REFERENCE_ACCEPTANCE, 4 * (1 - REFERENCE_ACCEPTANCE)
        self.maximum = self._ceiling()
        self.value = max(1, min(initial, self.maximum))

    @property
    def acceptance(self) -> float:
        """The chance a draft is kept given the one before it was: kept / (kept + misses)."""
        return self._kept / (self._kept + self._missed)

    def _ceiling(self) -> int:
        if self.costs is None:
            return self.limit
        return max(1, min(self.limit, self.costs.best_rows(self.acceptance) - 1))

    def record(self, kept: int, missed: int) -> None:
        """Drafts kept, and drafts rejected after the one before was kept: a chain's pass rejects one or
        none; a sampled tree's counts its first candidates (HeadDrafter.observe_candidates)."""
        self._kept += kept
        self._missed += missed
        self.maximum = self._ceiling()
        self.value = min(self.value, self.maximum)

    def update(self, num_proposed: int, num_accepted: int) -> None:
        if num_proposed:
            self.record(num_accepted, num_accepted < num_proposed)
        if num_proposed and num_accepted == num_proposed:
            self.value = min(self.maximum, self.value + 2)
        else:
            self.value = max(1, self.value - 1)


@dataclass(frozen=True)
class ControllerConfig:
    verify_cost: float = 0.03  # extra cost of each verified draft, in target steps (bf16 CPU: ~1.2x for 8)
    window: int = 8  # verify passes the decision looks back over
    min_gain: float = 1.0  # speculate while tokens per unit of cost stays above this
    pause_steps: int = 16  # first back-off, in decode steps; doubles on each pause in a row
    max_pause_steps: int = 256


class SpeculationController:
    """Pauses speculation for a request where it does not pay, and says how often it did."""

    def __init__(self, config: ControllerConfig, draft_cost: float = 0.0) -> None:
        self.config = config
        self.draft_cost = draft_cost
        self._recent: deque[tuple[float, float]] = deque(maxlen=config.window)  # (tokens, cost)
        self._pause_left = 0
        self._next_pause = config.pause_steps

    def should_speculate(self) -> bool:
        if self._pause_left > 0:
            self._pause_left -= 1
            return False
        return True

    def observe(self, num_proposed: int, num_accepted: int, model_drafted: int = 0) -> None:
        cost = 1.0 + self.config.verify_cost * num_proposed + self.draft_cost * model_drafted
        self._recent.append((1.0 + num_accepted, cost))
        if len(self._recent) < self._recent.maxlen:  # type: ignore[operator]
            return
        tokens = sum(t for t, _ in self._recent)
        spent = sum(c for _, c in self._recent)
        if tokens / spent < self.config.min_gain:
            self._pause_left = self._next_pause
            self._next_pause = min(self._next_pause * 2, self.config.max_pause_steps)
            self._recent.clear()
        elif tokens / spent > 1.25 * self.config.min_gain:
            self._next_pause = self.config.pause_steps

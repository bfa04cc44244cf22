"""Whether a model drafter's passes earn tokens faster than plain steps would, by the request's own
wall time.

Behind prompt lookup a draft model proposes only where lookup has nothing, so the alternative to its
pass is a plain target step. Whether its pass beats that step is the machine's and the context's: its
drafting reads its weights from memory after each target pass, and each verified row attends over the
whole context (a 7-row pass costs ~1.3 steps at 300 tokens, ~2.2 at 2,800). Counts priced by costs
measured at load mispredicted it both ways (decoding/drafts/README.md, "Sampled requests"), so the gate
times the request itself: the first plain steps give the step's time, each window of the drafter's
passes its tokens per second, and a window slower than plain steps sits the drafter out for a back-off
(doubling while it keeps losing), after which it probes again. Which tokens come out never depends on
it, only which passes carry drafts.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class GateConfig:
    warmup: int = 2  # plain steps timed before the drafter first runs
    # the drafter's passes a decision looks back over: 6 decided better than 3 (the default engine 1.589x ->
    # 1.630x and 1.583x -> 1.620x target-only on two sets of 20 single-turn prompts, decoding alone,
    # interleaved; 8 no better), a window of 3 keeping or pausing the head on a lucky or unlucky pass
    window: int = 6
    pause: int = 16  # first back-off, in passes the drafter would have run; doubles while it loses
    max_pause: int = 128
    plain_steps: int = 16  # the latest plain steps whose median is the step's time


class TimedGate:
    """One request's gate for one model drafter."""

    def __init__(self, config: GateConfig | None = None) -> None:
        self.config = config or GateConfig()
        self._plain: deque[float] = deque(maxlen=self.config.plain_steps)  # seconds of plain steps
        self._window: list[tuple[int, float]] = []  # (tokens, seconds) of the drafter's passes
        self._pause_left = 0
        self._next_pause = self.config.pause
        self.sat_out = 0  # passes the drafter was kept out of

    def allows(self) -> bool:
        """Whether the drafter may propose this pass (a pass it is kept out of counts down its pause)."""
        if len(self._plain) < self.config.warmup:
            self.sat_out += 1
            return False
        if self._pause_left > 0:
            self._pause_left -= 1
            self.sat_out += 1
            return False
        return True

    def plain(self, seconds: float) -> None:
        """A pass that carried no drafts: one token in `seconds`."""
        self._plain.append(seconds)

    def drafted(self, tokens: int, seconds: float) -> None:
        """A pass where the drafter ran (its proposal, whatever it drafted, and the verification): `tokens`
        emitted in `seconds`."""
        self._window.append((tokens, seconds))
        if len(self._window) < self.config.window:
            return
        rate = sum(t for t, _ in self._window) / sum(s for _, s in self._window)
        plain_rate = 1.0 / statistics.median(self._plain)
        self._window.clear()
        if rate < plain_rate:
            self._pause_left = self._next_pause
            self._next_pause = min(2 * self._next_pause, self.config.max_pause)
        else:
            self._next_pause = self.config.pause

"""Per-request speculative-decoding statistics, in vLLM's words (draft, accepted, per position).

They count what the target's passes verified: a pass whose accepted drafts run past an end of turn or
a stop sequence counts them all, though the generation keeps its tokens only up to that end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecStats:
    draft_tokens: int = 0  # tokens proposed and verified
    accepted_tokens: int = 0  # proposed tokens the target kept
    verify_passes: int = 0  # target passes that verified at least one draft token
    target_passes: int = 0  # every target forward, prefill included
    paused_steps: int = 0  # decode steps where the controller chose not to speculate
    tree_passes: int = 0  # verify passes of a draft tree (decoding/tree.py) rather than a chain
    grammar_s: float = 0.0  # time inside the grammar (masks, advance, rollback), drafters' calls included
    # prompt tokens read from the cache the engine's previous request left (Engine: prefix reuse)
    cached_prompt_tokens: int = 0
    # [position] how often a draft was proposed / accepted at that offset of a proposal
    per_position_drafted: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)
    # drafter name -> [drafted, accepted]
    by_source: dict[str, list[int]] = field(default_factory=dict)

    def record(self, sources: list[str], num_accepted: int) -> None:
        """One verify pass of len(sources) drafts, of which the first `num_accepted` were kept."""
        k = len(sources)
        self.draft_tokens += k
        self.accepted_tokens += num_accepted
        self.verify_passes += 1
        while len(self.per_position_drafted) < k:
            self.per_position_drafted.append(0)
            self.per_position_accepted.append(0)
        for i, source in enumerate(sources):
            self.per_position_drafted[i] += 1
            counts = self.by_source.setdefault(source, [0, 0])
            counts[0] += 1
            if i < num_accepted:
                self.per_position_accepted[i] += 1
                counts[1] += 1

    def record_tree(self, source: str, nodes: int, depth: int, num_accepted: int) -> None:
        """One verify pass of a draft tree of `nodes` tokens `depth` deep, `num_accepted` deep kept;
        per position counts the tree's depths."""
        self.draft_tokens += nodes
        self.accepted_tokens += num_accepted
        self.verify_passes += 1
        self.tree_passes += 1
        while len(self.per_position_drafted) < depth:
            self.per_position_drafted.append(0)
            self.per_position_accepted.append(0)
        for i in range(depth):
            self.per_position_drafted[i] += 1
            self.per_position_accepted[i] += i < num_accepted
        counts = self.by_source.setdefault(source, [0, 0])
        counts[0] += nodes
        counts[1] += num_accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verify pass: 1 + accepted / passes (1.0 when nothing was verified)."""
        return 1.0 + self.accepted_tokens / self.verify_passes if self.verify_passes else 1.0

    def merge(self, other: SpecStats) -> None:
        self.draft_tokens += other.draft_tokens
        self.accepted_tokens += other.accepted_tokens
        self.verify_passes += other.verify_passes
        self.target_passes += other.target_passes
        self.paused_steps += other.paused_steps
        self.tree_passes += other.tree_passes
        self.grammar_s += other.grammar_s
        self.cached_prompt_tokens += other.cached_prompt_tokens
        for i, (d, a) in enumerate(zip(other.per_position_drafted, other.per_position_accepted, strict=True)):
            if i >= len(self.per_position_drafted):
                self.per_position_drafted.append(0)
                self.per_position_accepted.append(0)
            self.per_position_drafted[i] += d
            self.per_position_accepted[i] += a
        for source, (d, a) in other.by_source.items():
            counts = self.by_source.setdefault(source, [0, 0])
            counts[0] += d
            counts[1] += a

    def to_dict(self) -> dict[str, Any]:
        return {
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "verify_passes": self.verify_passes,
            "target_passes": self.target_passes,
            "paused_steps": self.paused_steps,
            "tree_passes": self.tree_passes,
            "grammar_s": round(self.grammar_s, 6),
            "per_position_acceptance": [
                round(a / d, 4) if d else 0.0
                for d, a in zip(self.per_position_drafted, self.per_position_accepted, strict=True)
            ],
            "by_drafter": {s: {"draft_tokens": d, "accepted_tokens": a} for s, (d, a) in self.by_source.items()},
        }

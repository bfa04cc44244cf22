"""Bench results: one row per configuration and category (plus "all"), as a table or JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from decoding.bench.constrained import ConstrainedReport
from decoding.stats import SpecStats

# A greedy divergence between two bf16 computations is a near-tie when the target's logits of the two
# tokens differ by less than this (bf16 keeps 8 significant bits: ~0.1 at a logit of 20, and a verify
# pass of k tokens rounds differently from k single steps).
NEAR_TIE_GAP = 0.5


@dataclass
class Divergence:
    prompt_id: str
    position: int  # index in the generated tokens of the first difference
    reference_token: int
    token: int
    logit_gap: float  # target logit of reference_token minus that of token, at that position

    @property
    def near_tie(self) -> bool:
        return abs(self.logit_gap) < NEAR_TIE_GAP

    def to_dict(self) -> dict[str, Any]:
        return {"prompt": self.prompt_id, "position": self.position, "reference_token": self.reference_token,
                "token": self.token, "logit_gap": round(self.logit_gap, 4) if self.logit_gap != float("inf") else None,
                "near_tie": self.near_tie}


@dataclass
class Measurement:
    """What one configuration did on one category."""

    tokens: int = 0
    seconds: float = 0.0  # prompt processing included, as the peers' numbers are
    # the tokens after each output's first, and the seconds they took: decoding alone, where a long prompt's
    # processing would hide what speculation does (None where a peer does not time its first token)
    decode_tokens: int = 0
    decode_seconds: float | None = 0.0
    stats: SpecStats | None = None
    compared: int = 0  # prompts compared with the reference output
    identical: int = 0
    divergences: list[Divergence] = field(default_factory=list)

    def add(self, tokens: int, seconds: float, stats: SpecStats | None, decode_seconds: float | None = None) -> None:
        self.tokens += tokens
        self.seconds += seconds
        if decode_seconds is None or self.decode_seconds is None:
            self.decode_seconds = None
        else:
            self.decode_tokens += max(tokens - 1, 0)
            self.decode_seconds += decode_seconds
        if stats is not None:
            if self.stats is None:
                self.stats = SpecStats()
            self.stats.merge(stats)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float | None:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else None


@dataclass
class Row:
    name: str
    category: str
    reference: str | None  # the configuration whose greedy output this one must equal
    m: Measurement
    baseline_tps: float
    baseline_decode_tps: float | None = None  # target-only's decoding alone

    def to_dict(self) -> dict[str, Any]:
        s = self.m.stats
        spec = s if s is not None and s.draft_tokens > 0 else None
        decode = self.m.decode_tokens_per_s
        return {
            "name": self.name,
            "category": self.category,
            "tokens": self.m.tokens,
            "seconds": round(self.m.seconds, 3),
            "tokens_per_s": round(self.m.tokens_per_s, 2),
            "acceptance_rate": round(spec.acceptance_rate, 4) if spec else None,
            "mean_acceptance_length": round(spec.mean_acceptance_length, 4) if spec else None,
            "target_passes_per_token": round(s.target_passes / self.m.tokens, 4) if s and self.m.tokens else None,
            "speedup_vs_target_only": round(self.m.tokens_per_s / self.baseline_tps, 3) if self.baseline_tps else None,
            "decode_tokens_per_s": round(decode, 2) if decode else None,
            "decode_speedup_vs_target_only": (round(decode / self.baseline_decode_tps, 3)
                                              if decode and self.baseline_decode_tps else None),
            "greedy_identical": (self.m.identical == self.m.compared) if self.reference and self.m.compared else None,
            "reference": self.reference,
            "identical_prompts": f"{self.m.identical}/{self.m.compared}" if self.reference else None,
            "divergences": [d.to_dict() for d in self.m.divergences],
            "paused_steps": s.paused_steps if s else None,
        }


@dataclass
class BenchReport:
    rows: list[Row]
    meta: dict[str, Any]
    constrained: ConstrainedReport | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"meta": self.meta, "configs": [r.to_dict() for r in self.rows]}
        if self.constrained is not None:
            out["constrained"] = self.constrained.to_dict()
        return out

    def table(self) -> str:
        tables = [self._table()] if self.rows else []
        if self.constrained is not None:
            tables.append(self.constrained.table())
        return "\n\n".join(tables)

    def _table(self) -> str:
        head = f"{'configuration':<26}{'category':<10}{'tok/s':>8}{'speedup':>9} {'decode':>7} {'accept':>8}" \
               f"{'acc.len':>8}{'pass/tok':>9}  identical"
        lines = [head, "-" * len(head)]
        default = self.meta.get("default_config")
        for r in self.rows:
            d = r.to_dict()

            def fmt(v: Any, spec: str) -> str:
                width = int(spec.split(".")[0])
                return "-".rjust(width) if v is None else format(v, spec)

            decode = d["decode_speedup_vs_target_only"]
            ident = "-" if d["greedy_identical"] is None else ("yes" if d["greedy_identical"] else "NO")
            if d["divergences"]:
                ties = sum(1 for x in d["divergences"] if x["near_tie"])
                ident += f" ({d['identical_prompts']}; {len(d['divergences'])} divergent, {ties} near-ties)"
            name = f"{r.name} *" if r.name == default else r.name
            lines.append(
                f"{name:<26}{r.category:<10}{fmt(d['tokens_per_s'], '8.1f')}"
                f"{fmt(d['speedup_vs_target_only'], '8.2f')}x "
                f"{'-'.rjust(7) if decode is None else format(decode, '6.2f') + 'x'} "
                f"{fmt(d['acceptance_rate'], '8.2f')}{fmt(d['mean_acceptance_length'], '8.2f')}"
                f"{fmt(d['target_passes_per_token'], '9.3f')}  {ident}"
            )
        if default is not None and any(r.name == default for r in self.rows):
            lines.append("* the gateway's default for these requests (policies/default.yaml)")
        lines.append("speedup: tokens/s over target-only's, end to end; decode: the same without the prompt's "
                     "processing; accept: drafts kept / drafted; acc.len: tokens a verify pass yields; pass/tok: "
                     "target forward passes per generated token (plain steps included; 1.000 for target-only)")
        if any(r.reference for r in self.rows):
            lines.append(f"identical: greedy outputs equal to the row's reference, prompts equal / compared (engine "
                         f"rows: target-only, and they must be; HF rows: HF's own generate). A near-tie is a first "
                         f"divergence where the two tokens' target logits differ by less than {NEAR_TIE_GAP} (bf16 "
                         f"rounding)")
        return "\n".join(lines)

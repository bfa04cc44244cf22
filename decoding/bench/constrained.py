"""The `constrained` category: tool calls and schema outputs, per backend, speculation on and off.

Each request runs through `ChatEngine` as the gateway runs it (tools rendered, grammar compiled once,
output checked), interleaved between configurations. Reported per backend, for all requests and for the
tool calls and the schema outputs alone: tokens/s and the speedup of
constrained speculation over constrained target-only, greedy identity between the two, the share of
outputs that are complete and schema-valid, the grammar's cost per token and its share of the time,
and schema compile times over the corpus (p50 / p99, and the schemas a backend gave up on).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

from decoding.build import Draft, build_drafter, fit_to_machine
from decoding.chat_engine import ChatEngine, ChatRequest, ConstraintOptions, PreparedChat
from decoding.constraints.backends import BACKENDS, make_backend
from decoding.constraints.base import CompileTimeoutError, ConstraintError
from decoding.constraints.bounds import Bounds, bound_schema
from decoding.constraints.corpus import load_corpus
from decoding.drafters import Drafter
from decoding.generate import Engine, GenerationConfig, GenerationResult
from decoding.loading import LoadedModel
from decoding.progress import progress
from decoding.stats import SpecStats

BOUNDS = Bounds(string_length=64, digits=12)
OUTLINES_COMPILE_TIMEOUT_S = 60.0  # as served: the policy's default `constraints.compile_timeout_s`


ALL, TOOL_CALLS, SCHEMAS = "all", "tool calls", "schemas"  # the rows' kinds of request


def kind_of(request_id: str) -> str:
    return SCHEMAS if request_id.startswith("schema-") else TOOL_CALLS


def load_requests(quick: bool, max_new_tokens: int) -> list[tuple[str, ChatRequest]]:
    """(id, request) for the tool-call scenarios and the schema outputs; two of each with `quick`."""
    data = json.loads(resources.files("decoding.bench").joinpath("constrained.json").read_text(encoding="utf-8"))
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    tools = [
        (r["id"], ChatRequest(r["messages"], config, tools=[{"type": "function", "function": {"name": n, **data[
            "tools"][n]}} for n in r["tools"]], tool_choice=r["tool_choice"]))
        for r in data["requests"]
    ]
    by_id = {e["id"]: e for e in load_corpus()}
    schemas = [
        (f"schema-{i}", ChatRequest([{"role": "user", "content": by_id[i]["prompt"]}], config, response_format={
            "type": "json_schema", "json_schema": {"name": i.replace("-", "_"), "schema": by_id[i]["schema"],
                                                   "strict": True}}))
        for i in data["schemas"]
    ]
    return tools[:2] + schemas[:2] if quick else tools + schemas


@dataclass
class ConstrainedRow:
    backend: str
    name: str
    kind: str = ALL  # ALL, or the requests of one kind alone: TOOL_CALLS, SCHEMAS
    tokens: int = 0
    seconds: float = 0.0  # end to end: prompt processing included
    decode_seconds: float = 0.0  # from the first token to the last
    stats: SpecStats = field(default_factory=SpecStats)
    requests: int = 0
    valid: int = 0  # complete and schema-valid
    identical: int = 0  # greedy output equal to target-only's
    baseline_tokens_per_s: float = 0.0
    baseline_decode_tokens_per_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first per second of decoding: the speculative loop alone, no prefill."""
        return (self.tokens - self.requests) / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.baseline_tokens_per_s if self.baseline_tokens_per_s else 0.0

    @property
    def decode_speedup(self) -> float:
        base = self.baseline_decode_tokens_per_s
        return self.decode_tokens_per_s / base if base else 0.0

    @property
    def grammar_us_per_token(self) -> float:
        return self.stats.grammar_s / self.tokens * 1e6 if self.tokens else 0.0

    @property
    def grammar_share(self) -> float:
        return self.stats.grammar_s / self.seconds if self.seconds else 0.0

    def add(self, result: GenerationResult, seconds: float, valid: bool, identical: bool) -> None:
        """One request's run through this row's engine."""
        self.tokens += result.completion_tokens
        self.seconds += seconds
        self.decode_seconds += result.decode_s
        self.stats.merge(result.stats)
        self.requests += 1
        self.valid += valid
        self.identical += identical

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "config": self.name, "kind": self.kind, "requests": self.requests,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3), "tokens_per_s": round(self.tokens_per_s, 2),
            "speedup": round(self.speedup, 3), "decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
            "decode_speedup": round(self.decode_speedup, 3), "valid": self.valid,
            "identical_to_target_only": self.identical,
            "grammar_us_per_token": round(self.grammar_us_per_token, 1),
            "grammar_share": round(self.grammar_share, 4), **self.stats.to_dict(),
        }


@dataclass
class CompileTimes:
    backend: str
    seconds: list[float] = field(default_factory=list)
    gave_up: list[str] = field(default_factory=list)  # schema ids past the time limit

    def quantile(self, q: float) -> float:
        if not self.seconds:
            return 0.0
        if len(self.seconds) == 1:
            return self.seconds[0]
        return statistics.quantiles(self.seconds, n=100, method="inclusive")[round(q * 100) - 1]

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "schemas": len(self.seconds) + len(self.gave_up),
                "p50_s": round(self.quantile(0.5), 4), "p99_s": round(self.quantile(0.99), 4),
                "max_s": round(max(self.seconds, default=0.0), 4), "gave_up": self.gave_up}


@dataclass
class ConstrainedReport:
    rows: list[ConstrainedRow]
    compile_times: list[CompileTimes]
    failures: list[str]  # "backend config id: reason" for each output that was not complete and valid, or not run

    def table(self) -> str:
        width = max([16, *(len(r.name) for r in self.rows)])  # grammar+ngram+draft is 19
        head = (f"{'backend':9} {'requests':10} {'config':{width}} {'tok/s':>7} {'speedup':>7} {'decode':>7} "
                f"{'speedup':>7} "
                f"{'valid':>7} {'same':>7} {'accept':>6} "
                f"{'mean_len':>8} {'mask µs/tok':>11} {'mask share':>10}")
        lines = ["constrained (tool calls and schema outputs)", head, "-" * len(head)]
        for r in self.rows:
            lines.append(
                f"{r.backend:9} {r.kind:10} {r.name:{width}} {r.tokens_per_s:7.1f} {r.speedup:6.2f}x "
                f"{r.decode_tokens_per_s:7.1f} "
                f"{r.decode_speedup:6.2f}x {r.valid:>3}/{r.requests:<3} "
                f"{r.identical:>3}/{r.requests:<3} {r.stats.acceptance_rate:6.2f} "
                f"{r.stats.mean_acceptance_length:8.2f} "
                f"{r.grammar_us_per_token:11.0f} {r.grammar_share:10.1%}")
        lines.append("")
        lines.append(f"{'backend':9} {'schemas':>7} {'compile p50':>11} {'p99':>9} {'max':>9}  gave up")
        for c in self.compile_times:
            gave_up = ", ".join(c.gave_up) or "-"
            lines.append(f"{c.backend:9} {len(c.seconds) + len(c.gave_up):7} {c.quantile(0.5):10.3f}s "
                         f"{c.quantile(0.99):8.3f}s {max(c.seconds, default=0.0):8.3f}s  {gave_up}")
        lines += [f"not valid: {f}" for f in self.failures]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [r.to_dict() for r in self.rows], "compile": [c.to_dict() for c in self.compile_times],
                "failures": self.failures}


def _drafters(target: LoadedModel, draft: Draft | None) -> Drafter:
    drafter = build_drafter(["grammar", "ngram"] + (["draft"] if draft is not None else []), target, draft, 8)
    assert drafter is not None
    return drafter


def measure_compile(target: LoadedModel, backend: str, quick: bool,
                    compile_timeout_s: float = OUTLINES_COMPILE_TIMEOUT_S) -> CompileTimes:
    """Compile every corpus schema (bounded as served) with a fresh backend: no cache hits."""
    times = CompileTimes(backend)
    compiler = make_backend(backend, target.tokenizer, compile_timeout_s=compile_timeout_s)
    entries = load_corpus()[:8] if quick else load_corpus()
    for entry in progress(entries, desc=f"compile {backend}", unit="schema"):
        started = time.perf_counter()
        try:
            compiler.compile_json_schema(bound_schema(entry["schema"], BOUNDS, backend))
        except CompileTimeoutError:
            times.gave_up.append(entry["id"])
            continue
        times.seconds.append(time.perf_counter() - started)
    return times


def _run_requests(backend: str, engines: dict[str, Engine], prepared: dict[str, PreparedChat],
                  failures: list[str]) -> list[ConstrainedRow]:
    """Every prepared request through every engine: one row per engine; outputs that are not complete
    and valid go to `failures`."""
    warm = next(iter(prepared.values()))
    for engine in engines.values():  # warm-up: first calls allocate caches and pick kernels
        replace(warm, engine=engine, config=replace(warm.config, max_new_tokens=8)).start().close()
    kinds = (ALL, *sorted({kind_of(rid) for rid in prepared}, reverse=True))  # tool calls, then schemas
    rows = {(kind, name): ConstrainedRow(backend, name, kind) for kind in kinds for name in engines}
    outputs: dict[tuple[str, str], list[int]] = {}
    for rid, job in progress(prepared.items(), desc=f"constrained {backend}", unit="request"):
        for name, engine in engines.items():
            started = time.perf_counter()
            result = replace(job, engine=engine).start().result
            seconds = time.perf_counter() - started
            outputs[(name, rid)] = result.token_ids
            try:
                out = job.finish(result)
                if out.finish_reason == "length":
                    raise ConstraintError(f"cut by max_tokens: ...{result.text[-60:]!r}")
                valid = True
            except ConstraintError as exc:
                failures.append(f"{backend} {name} {rid}: {exc}")
                valid = False
            identical = outputs[(name, rid)] == outputs[("target-only", rid)]
            for kind in (ALL, kind_of(rid)):
                rows[(kind, name)].add(result, seconds, valid, identical)
    for (kind, _), row in rows.items():
        base = rows[(kind, "target-only")]
        row.baseline_tokens_per_s = base.tokens_per_s
        row.baseline_decode_tokens_per_s = base.decode_tokens_per_s
    return list(rows.values())


def run_constrained(target: LoadedModel, draft: Draft | None, quick: bool, max_new_tokens: int,
                    backends: tuple[str, ...] = BACKENDS,
                    compile_timeout_s: float = OUTLINES_COMPILE_TIMEOUT_S,
                    fit: bool = True) -> ConstrainedReport:
    requests = load_requests(quick, max_new_tokens)
    spec_name = "grammar+ngram" + ("+draft" if draft is not None else "")
    drafter = _drafters(target, draft)
    spec = Engine(target, fit_to_machine(target, drafter) if fit else drafter)
    engines = {"target-only": Engine(target), spec_name: spec}
    rows: list[ConstrainedRow] = []
    failures: list[str] = []
    compile_times = []
    for backend in backends:
        options = ConstraintOptions(backend=backend, bounds=BOUNDS, compile_timeout_s=compile_timeout_s)
        chat = ChatEngine(engines["target-only"], options)
        prepared: dict[str, PreparedChat] = {}
        for rid, req in requests:  # compiles once per request
            try:
                prepared[rid] = chat.prepare(req)
            except CompileTimeoutError as exc:  # reported with the outputs; the rest of the run goes on
                failures.append(f"{backend} {rid}: not run, its grammar did not compile ({exc})")
        if prepared:
            rows += _run_requests(backend, engines, prepared, failures)
        compile_times.append(measure_compile(target, backend, quick, compile_timeout_s))
    return ConstrainedReport(rows, compile_times, failures)

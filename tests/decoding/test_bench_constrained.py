"""The bench's constrained part: a grammar that does not compile in time is reported, and the run goes on."""

from __future__ import annotations

import pytest

from decoding.bench.constrained import ALL, SCHEMAS, TOOL_CALLS, load_requests, run_constrained
from decoding.loading import LoadedModel

pytestmark = pytest.mark.slow


def test_a_request_whose_grammar_gives_up_is_reported_not_fatal(embedded_model: LoadedModel) -> None:
    # no outlines index builds in a millisecond: every request's grammar gives up, as one did on a slow day
    report = run_constrained(embedded_model, None, quick=True, max_new_tokens=8, backends=("outlines",),
                             compile_timeout_s=0.001)
    ids = [rid for rid, _ in load_requests(True, 8)]
    assert [f.split(":")[0] for f in report.failures] == [f"outlines {rid}" for rid in ids]
    assert all("not run, its grammar did not compile (outlines gave up" in f for f in report.failures)
    assert report.rows == []  # nothing measured from requests that did not run
    (times,) = report.compile_times
    assert times.gave_up and len(times.gave_up) + len(times.seconds) == 8
    assert "not valid: outlines" in report.table()


def test_tool_calls_and_schema_outputs_are_reported_alone_and_together(embedded_model: LoadedModel) -> None:
    report = run_constrained(embedded_model, None, quick=True, max_new_tokens=24, backends=("xgrammar",))
    rows = {(r.kind, r.name): r for r in report.rows}
    assert set(rows) == {(k, n) for k in (ALL, TOOL_CALLS, SCHEMAS) for n in ("target-only", "grammar+ngram")}
    for name in ("target-only", "grammar+ngram"):
        whole, parts = rows[(ALL, name)], (rows[(TOOL_CALLS, name)], rows[(SCHEMAS, name)])
        assert [p.requests for p in parts] == [2, 2] and whole.requests == 4
        assert whole.tokens == sum(p.tokens for p in parts) and whole.seconds == pytest.approx(
            sum(p.seconds for p in parts))
        assert whole.identical == sum(p.identical for p in parts) == 4
    for kind in (TOOL_CALLS, SCHEMAS):  # each kind against its own target-only run
        assert rows[(kind, "grammar+ngram")].baseline_tokens_per_s == rows[(kind, "target-only")].tokens_per_s
        assert rows[(kind, "target-only")].speedup == pytest.approx(1.0)
    assert "tool calls" in report.table() and "schemas" in report.table()

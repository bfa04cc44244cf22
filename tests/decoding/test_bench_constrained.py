"""The bench's constrained part: a grammar that does not compile in time is reported, and the run goes on."""

from __future__ import annotations

import pytest

from decoding.bench.constrained import load_requests, run_constrained
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

"""The bench workload: four short categories by default, long agent sessions when asked for."""

from __future__ import annotations

import pytest

from decoding.bench.long_sessions import FINALS, SESSIONS, TURNS, session_plan
from decoding.bench.workload import CATEGORIES, LONG, load_workload
from decoding.tokenizer import Tokenizer


def test_the_long_sessions_run_only_when_named() -> None:
    assert {p.category for p in load_workload()} == set(CATEGORIES)
    long = load_workload(categories=(LONG,))
    assert len(long) == SESSIONS and {p.category for p in long} == {LONG}
    assert [p.id for p in load_workload(quick=True, categories=(LONG, "chat"))] == ["long-01", "long-02",
                                                                                   "chat-01", "chat-02"]
    with pytest.raises(ValueError, match="unknown categories"):
        load_workload(categories=("longer",))


def test_a_session_is_its_history_answered_then_its_task(embedded_tokenizer: Tokenizer) -> None:
    short = {p.id: p for p in load_workload()}
    for (final, history), session in zip(session_plan(list(short.values())), load_workload(categories=(LONG,)),
                                         strict=True):
        turns = [m for m in session.messages if m["role"] != "system"]
        assert [m["role"] for m in turns] == ["user", "assistant"] * TURNS + ["user"]
        users = [m["content"] for m in turns if m["role"] == "user"]
        want = [next(m["content"] for m in p.messages if m["role"] == "user") for p in [*history, final]]
        assert users == want
        assert all(m["content"] for m in turns if m["role"] == "assistant")  # the target's own replies
        assert final.id not in {p.id for p in history}
        assert int(final.id.rsplit("-", 1)[1]) - 1 in FINALS  # tasks the history never shows
        system = [m for m in final.messages if m["role"] == "system"]  # the task's own system prompt, if any
        assert session.messages[: len(system)] == system
        # what makes the category: a context several times the short prompts'
        assert 1500 <= len(embedded_tokenizer.apply_chat_template(session.messages)) <= 3000


def test_the_constrained_table_keeps_its_columns_under_a_long_configuration_name() -> None:
    from decoding.bench.constrained import ConstrainedReport, ConstrainedRow

    rows = [ConstrainedRow("outlines", name, tokens=200, seconds=1.0, decode_seconds=0.8, requests=20, valid=20,
                           identical=20, baseline_tokens_per_s=100.0, baseline_decode_tokens_per_s=110.0)
            for name in ("target-only", "grammar+ngram+draft")]
    lines = ConstrainedReport(rows=rows, compile_times=[], failures=[]).table().splitlines()
    head, short, long = lines[1], lines[3], lines[4]
    end = head.index("tok/s") + len("tok/s")  # right-aligned: each row's number ends under the header's end
    assert short[end - 1] != " " and long[end - 1] != " " and short[end] == long[end] == " "
    assert len(short) == len(long) == len(head)

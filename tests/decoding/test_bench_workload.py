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


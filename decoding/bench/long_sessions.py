"""The `long` bench category: agent sessions whose context has grown to 1.5k-3k tokens.

An agent's requests carry their history: every earlier turn, and the model's own replies to them. At
such a context attention is much of each target pass (decoding/pass_costs.py), which the four short
categories never show. Each session here ends in one of the workload's own tasks (a tool call, an edit
to copy, a summary, a chat answer) after eight earlier turns taken from the other prompts, each
answered by the embedded target itself (greedy, up to 96 tokens): the history an agent would send.

The sessions are built once and shipped as long.json, so every run measures the same prompts:

    .venv/bin/python -m decoding.bench.long_sessions
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from decoding.bench.workload import CATEGORIES, LONG, BenchPrompt, load_workload

SESSIONS = 8
TURNS = 8  # earlier turns in a session
REPLY_TOKENS = 96  # each earlier reply, at most
FINALS = (6, 7)  # which prompt of its category a session ends in (the history draws on the first six)
PATH = Path(__file__).with_name("long.json")


def session_plan(prompts: list[BenchPrompt]) -> list[tuple[BenchPrompt, list[BenchPrompt]]]:
    """For each session: the task it ends in, and the prompts whose user turns make its history."""
    by_category = {c: [p for p in prompts if p.category == c] for c in CATEGORIES}
    plan = []
    for j in range(SESSIONS):
        final = by_category[CATEGORIES[j % len(CATEGORIES)]][FINALS[j // len(CATEGORIES)]]
        history = [by_category[CATEGORIES[(j + t + 1) % len(CATEGORIES)]][(j + 3 * t) % FINALS[0]]
                   for t in range(TURNS)]
        plan.append((final, history))
    return plan


def _user_turn(prompt: BenchPrompt) -> dict[str, Any]:
    return next(m for m in prompt.messages if m["role"] == "user")


def build_sessions() -> list[dict[str, Any]]:
    """Run the embedded target over each session's history, turn by turn -> workload entries."""
    from decoding.build import build_engine
    from decoding.generate import GenerationConfig
    from decoding.sampling import SamplingParams

    engine = build_engine()  # greedy: the same replies as target-only, faster
    tokenizer = engine.target.tokenizer
    config = GenerationConfig(max_new_tokens=REPLY_TOKENS, sampling=SamplingParams(temperature=0.0))
    sessions = []
    for j, (final, history) in enumerate(session_plan(load_workload())):
        messages = [m for m in final.messages if m["role"] == "system"]
        for prompt in history:
            messages.append(_user_turn(prompt))
            reply = engine.complete(tokenizer.apply_chat_template(messages), config)
            messages.append({"role": "assistant", "content": tokenizer.decode(reply.token_ids).strip()})
        messages.append(_user_turn(final))
        sessions.append({"id": f"long-{j + 1:02d}", "category": LONG, "ends_in": final.id, "messages": messages,
                         "history": [p.id for p in history]})
        print(f"{sessions[-1]['id']}: {len(tokenizer.apply_chat_template(messages))} tokens, ends in {final.id}")
    return sessions


def main() -> None:
    sessions = build_sessions()
    PATH.write_text(json.dumps({"version": 1, "built_by": "python -m decoding.bench.long_sessions",
                                "prompts": sessions}, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {PATH}")


if __name__ == "__main__":
    main()

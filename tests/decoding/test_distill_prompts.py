"""The distillation prompts: seeded, varied, well-formed, and disjoint from the bench workload."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from decoding.bench.workload import load_workload
from decoding.distill.agent_prompts import AGENT_TOOLS, agent_prompts
from decoding.distill.prompts import stage_one


def test_agent_prompts_are_the_same_for_a_seed_and_differ_across_seeds() -> None:
    first = [p.messages for p in agent_prompts(random.Random(3), 40)]
    assert first == [p.messages for p in agent_prompts(random.Random(3), 40)]
    assert first != [p.messages for p in agent_prompts(random.Random(4), 40)]


def test_agent_prompts_cover_every_shape_and_rarely_repeat() -> None:
    prompts = agent_prompts(random.Random(0), 200)
    assert Counter(p.category for p in prompts) == {"tool": 50, "copy": 50, "summary": 50, "chat": 50}
    users = [p.messages[-1]["content"] for p in prompts]
    assert len(set(users)) >= 0.8 * len(users)


def test_tool_prompts_list_real_tools_and_ask_for_the_first_one() -> None:
    names = {tool["name"]: tool for tool, _ in AGENT_TOOLS}
    for prompt in (p for p in agent_prompts(random.Random(1), 80) if p.category == "tool"):
        system = prompt.messages[0]["content"]
        listed = [json.loads(line) for line in system.splitlines() if line.startswith('{"name"')]
        assert listed and all(tool == names[tool["name"]] for tool in listed)
        assert "{" not in prompt.messages[1]["content"].replace("{}", "")  # every placeholder was filled


@pytest.mark.parametrize("seed", [0, 1])  # the shipped head's two prompt rounds (`draftgate distill --rounds 2`)
def test_no_distillation_prompt_is_a_bench_prompt(seed: int) -> None:
    bench = {m["content"] for p in load_workload() for m in p.messages if m["role"] == "user"}
    rng = random.Random(seed)  # drawn as decoding/distill/data.py draws them
    ours = {p.messages[-1]["content"] for p in stage_one(rng, 320) + agent_prompts(rng, 400)}
    assert len(ours) > 300 and not bench & ours

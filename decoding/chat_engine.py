"""A chat request end to end on a local engine: render, constrain, generate, check.

`ChatEngine.prepare` does everything that can fail on the request's own fault before any token is
generated (messages, tools, tool_choice, response_format, preflight, compile, context length);
`PreparedChat.start` runs it, and `PreparedChat.finish` turns the generation's text into the checked
`ChatOutput` (tool calls parsed, JSON validated). The gateway streams between the two.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from decoding.chat import render_prompt
from decoding.constraints.backends import Backend, make_backend
from decoding.constraints.bounds import Bounds
from decoding.errors import STOP_WITH_STRUCTURE, ParameterCombinationError
from decoding.generate import Engine, Generation, GenerationConfig, GenerationResult
from decoding.structured import ChatOutput, OutputPlan, parse_response_format, plan_output
from decoding.tools import parse_tool_choice, parse_tools


@dataclass(frozen=True)
class ConstraintOptions:
    backend: str = "outlines"
    allow_validate_after: bool = False  # generate under what the backend enforces, validate the rest after
    bounds: Bounds | None = None  # limits on unbounded strings and numbers (a small model runs on in them)
    compile_timeout_s: float | None = 60.0  # give up on a schema outlines cannot compile in this time
    cache_dir: Path | None = None  # outlines' compiled indexes persist here ($DRAFTGATE_CACHE/outlines)


@dataclass(frozen=True)
class ChatRequest:
    messages: Any
    config: GenerationConfig = field(default_factory=GenerationConfig)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: Any = None
    fit_max_tokens: bool = False  # the client set no limit: cut max_new_tokens to what the context leaves
    limit_field: str = "max_tokens"  # the request field that set max_new_tokens, as errors name it


@dataclass
class PreparedChat:
    prompt: list[int]
    config: GenerationConfig
    plan: OutputPlan
    engine: Engine

    def start(self) -> Generation:
        return self.engine.generate(self.prompt, self.config)

    def finish(self, result: GenerationResult) -> ChatOutput:
        return self.plan.finish(result.text, result.finish_reason)


class ChatEngine:
    """An `Engine` plus the constraint backends over its tokenizer (built once, on first use)."""

    def __init__(self, engine: Engine, constraints: ConstraintOptions | None = None) -> None:
        self.engine = engine
        self.constraints = constraints or ConstraintOptions()
        self._backends: dict[str, Backend] = {}
        self._lock = threading.Lock()

    def backend(self, name: str) -> Backend:
        with self._lock:
            if name not in self._backends:
                self._backends[name] = make_backend(name, self.engine.target.tokenizer,
                                                    self.constraints.compile_timeout_s, self.constraints.cache_dir)
            return self._backends[name]

    def prepare(self, request: ChatRequest) -> PreparedChat:
        options = self.constraints
        tools = parse_tools(request.tools)
        choice = parse_tool_choice(request.tool_choice, tools, request.parallel_tool_calls)
        response_format = parse_response_format(request.response_format)
        plan = plan_output(tools, choice, response_format, options.backend, options.allow_validate_after,
                           options.bounds)
        config = request.config
        if plan.spec is not None:
            if config.stop:
                raise ParameterCombinationError(STOP_WITH_STRUCTURE, param="stop")
            config = replace(config, grammar=self.backend(options.backend).compile(plan.spec))
        prompt = render_prompt(self.engine.target.tokenizer, request.messages, tools, choice, plan.json_schema)
        if request.fit_max_tokens:
            room = max(self.engine.max_context - len(prompt), 1)
            config = replace(config, max_new_tokens=min(config.max_new_tokens, room))
        self.engine.check_length(prompt, config, request.limit_field)
        return PreparedChat(prompt, config, plan, self.engine)

    def complete(self, request: ChatRequest) -> tuple[ChatOutput, GenerationResult]:
        prepared = self.prepare(request)
        result = prepared.start().result
        return prepared.finish(result), result

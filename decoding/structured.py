"""What a chat request's output must be (`response_format`, `tools`, `tool_choice`), and the checked result.

`plan_output` turns the request's fields into a `GrammarSpec` after preflight — every keyword the
chosen backend would not enforce is refused by name, unless the caller allows generating under what it
does enforce and validating afterwards (`strict: false`, or the route's policy). `OutputPlan.finish`
validates every complete constrained output with `jsonschema` before it is returned, and parses tool
calls into OpenAI `tool_calls`.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from decoding.constraints.base import ConstraintError, UnsupportedKeywordError
from decoding.constraints.bounds import Bounds, bound_schema
from decoding.constraints.preflight import Unsupported, check_schema, preflight, validate_output
from decoding.constraints.spec import TOOL_CALL_MARKER, GrammarSpec
from decoding.errors import InvalidRequestError
from decoding.tools import Tool, ToolCall, ToolChoice, calls_schema, cut_tool_calls, tool_calls_from

SCHEMA_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ANY_OBJECT: dict[str, Any] = {"type": "object"}


class OutputValidationError(ConstraintError):
    """A complete output that fails its schema (possible only where validate-after was allowed)."""

    code = "output_validation_failed"


@dataclass(frozen=True)
class ResponseFormat:
    type: str  # "text" | "json_object" | "json_schema"
    schema: dict[str, Any] | None = None
    name: str | None = None
    strict: bool | None = None


def parse_response_format(raw: Any) -> ResponseFormat:
    if raw is None:
        return ResponseFormat("text")
    if not isinstance(raw, dict) or raw.get("type") not in ("text", "json_object", "json_schema"):
        raise InvalidRequestError("'response_format.type' must be text, json_object or json_schema",
                                  param="response_format.type")
    if raw["type"] == "text":
        return ResponseFormat("text")
    if raw["type"] == "json_object":
        return ResponseFormat("json_object", ANY_OBJECT)
    spec = raw.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidRequestError("'response_format.json_schema' must be an object with a name and a schema",
                                  param="response_format.json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not SCHEMA_NAME.match(name):
        raise InvalidRequestError("'response_format.json_schema.name' must match [a-zA-Z0-9_-]{1,64}",
                                  param="response_format.json_schema.name")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise InvalidRequestError("'response_format.json_schema.schema' must be a JSON schema object",
                                  param="response_format.json_schema.schema")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequestError("'response_format.json_schema.strict' must be a boolean",
                                  param="response_format.json_schema.strict")
    try:
        check_schema(schema)
    except ConstraintError as exc:
        raise ConstraintError(str(exc), param="response_format.json_schema.schema") from exc
    return ResponseFormat("json_schema", schema, name, strict)


@dataclass
class ChatOutput:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    parsed: Any = None  # the JSON value of a response_format output


@dataclass(frozen=True)
class OutputPlan:
    spec: GrammarSpec | None  # None: unconstrained text
    json_schema: dict[str, Any] | None = None  # what a JSON output must validate against
    calls: dict[str, Any] | None = None  # what a tool-call array must validate against
    validated_after: tuple[Unsupported, ...] = ()  # keywords generated loosely and checked after

    def finish(self, text: str, finish_reason: str) -> ChatOutput:
        """Check and shape a generation's text: tool calls parsed, JSON validated."""
        calls = None  # the call array's text, when the output is tool calls
        if self.spec is not None and self.calls is not None and text.startswith(self.spec.marker):
            calls = text[len(self.spec.marker):]
        if calls is not None and finish_reason == "length":
            # never the marker syntax as content: cut inside the array, the calls as far as they got (as
            # OpenAI returns a call cut short); a complete array was cut only before the end the grammar
            # forces after it, and stands as the calls below
            try:
                json.loads(calls)
            except json.JSONDecodeError:
                return ChatOutput(None, cut_tool_calls(calls), "length")
        elif self.spec is None or finish_reason != "stop":
            # cut by max_tokens (or cancelled): incomplete, returned as is with its finish_reason; but a cut
            # inside the marker itself ("<tool_ca") is a call cut before it began: no content, no call
            if self.calls is not None and text and self.spec is not None and self.spec.marker.startswith(text):
                return ChatOutput(None, finish_reason=finish_reason)
            return ChatOutput(text, finish_reason=finish_reason)
        if calls is not None:
            assert self.calls is not None
            try:
                parsed = validate_output(calls, self.calls)
            except ConstraintError as exc:
                raise OutputValidationError(f"tool call failed validation: {exc}") from exc
            return ChatOutput(None, tool_calls_from(parsed), "tool_calls")
        if self.json_schema is not None:
            try:
                value = validate_output(text, self.json_schema)
            except ConstraintError as exc:
                raise OutputValidationError(str(exc)) from exc
            return ChatOutput(text, finish_reason="stop", parsed=value)
        return ChatOutput(text, finish_reason="stop")


def _check(schema: dict[str, Any], backend: str, allow_after: bool, where: str) -> list[Unsupported]:
    try:
        return preflight(schema, backend, allow_validate_after=allow_after)
    except UnsupportedKeywordError as exc:
        raise UnsupportedKeywordError(f"{where}: {exc}", param=where) from exc
    except ConstraintError as exc:
        raise ConstraintError(f"{where}: {exc}", param=where) from exc


# keywords that only narrow what a schema takes: without them a backend generates a superset, which the
# check after narrows again (a keyword whose removal could narrow, such as patternProperties beside
# additionalProperties false, is never taken out)
_LOOSENABLE = frozenset({"format", "pattern", "minLength", "maxLength", "multipleOf", "uniqueItems", "not",
                         "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "contains", "minContains",
                         "maxContains", "propertyNames", "if", "then", "else", "minProperties", "maxProperties",
                         "dependentRequired"})


def loosened(schema: dict[str, Any], missing: list[Unsupported]) -> dict[str, Any]:
    """`schema` without the keywords its backend would not enforce (`missing`, from preflight), where taking
    them out only widens it: what a validate-after request is generated under. outlines refuses to compile
    a format it lacks (`hostname`), so leaving it in failed the request that `strict: false` asked for."""
    if not missing:
        return schema
    out = copy.deepcopy(schema)
    for item in missing:
        key = item.keyword.split(" ", 1)[0].removesuffix(":")  # "format: hostname", "pattern (with format)"
        if key not in _LOOSENABLE:
            continue
        node: Any = out
        for step in [s for s in item.path.split("/") if s]:
            node = node[int(step)] if isinstance(node, list) and step.isdigit() else (
                node.get(step) if isinstance(node, dict) else None)
        if isinstance(node, dict):
            node.pop(key, None)
    return out


def plan_output(
    tools: list[Tool],
    choice: ToolChoice,
    response_format: ResponseFormat,
    backend: str,
    allow_validate_after: bool = False,
    bounds: Bounds | None = None,
) -> OutputPlan:
    """The grammar for this request's output, after preflight under `backend`."""
    json_schema = response_format.schema if response_format.type != "text" else None
    unenforced: list[Unsupported] = []
    generated = json_schema  # what the backend compiles: the schema less what it would not enforce
    if json_schema is not None:
        allow = allow_validate_after or response_format.strict is False
        missing = _check(json_schema, backend, allow, "response_format.json_schema.schema")
        unenforced += missing
        generated = loosened(json_schema, missing)
    calls, grammar_calls = None, None
    if choice.mode != "none":
        compiled = list(tools)
        for i, tool in enumerate(tools):
            if tool.name in choice.allowed:
                allow = allow_validate_after or tool.strict is False
                missing = _check(tool.parameters, backend, allow, f"tools[{i}].function.parameters")
                unenforced += missing
                compiled[i] = replace(tool, parameters=loosened(tool.parameters, missing))
        calls, grammar_calls = calls_schema(tools, choice), calls_schema(compiled, choice)
    if json_schema is None and calls is None:
        return OutputPlan(None)

    def bounded(schema: dict[str, Any] | None) -> dict[str, Any] | None:
        return schema if schema is None or bounds is None else bound_schema(schema, bounds, backend)

    spec = GrammarSpec(
        json_schema=bounded(generated) if choice.mode != "required" else None,
        calls_schema=bounded(grammar_calls),
        free_text=choice.mode == "auto" and json_schema is None,
        marker=TOOL_CALL_MARKER,
    )
    return OutputPlan(spec, json_schema if spec.json_schema is not None else None, calls, tuple(unenforced))

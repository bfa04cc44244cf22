"""OpenAI-style tools: parse `tools` and `tool_choice`, build the schema of a valid call, parse calls out.

A tool call is the marker `<tool_call>` then a JSON array of `{"name": ..., "arguments": {...}}`, one
item per call (at most one unless parallel calls are allowed). The array's schema allows exactly the
permitted tools, each with its own parameters, so a constrained call is always well-formed: a known
name and arguments valid for it.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import string
from dataclasses import dataclass
from typing import Any

from decoding.constraints.base import ConstraintError
from decoding.constraints.preflight import DATA_KEYWORDS, SUBSCHEMA_MAPS, check_schema
from decoding.constraints.spec import TOOL_CALL_MARKER
from decoding.errors import ToolError, UnknownToolError

NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool | None = None  # OpenAI's flag: explicit False allows validate-after for unenforced keywords

    def to_openai(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # "none" | "auto" (text or calls) | "required" (calls)
    allowed: tuple[str, ...]  # the tools that may be called
    max_calls: int | None  # None: any number (parallel calls); 1 otherwise


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as a string (the OpenAI wire form)

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_tools(raw: Any) -> list[Tool]:
    """Validate `tools` (OpenAI function tools); every error names the offending field."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ToolError("'tools' must be an array of function tools", param="tools")
    tools: list[Tool] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(item, dict) or item.get("type") != "function":
            raise ToolError(f"{where}: only tools of type 'function' are supported", param=f"{where}.type")
        fn = item.get("function")
        if not isinstance(fn, dict):
            raise ToolError(f"{where}.function must be an object", param=f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise ToolError(f"{where}.function.name must match [a-zA-Z0-9_-]{{1,64}}, got {name!r}",
                            param=f"{where}.function.name")
        if name in seen:
            raise ToolError(f"{where}: duplicate tool name {name!r}", param=f"{where}.function.name")
        seen.add(name)
        parameters = fn.get("parameters", NO_PARAMETERS)
        if not isinstance(parameters, dict):
            raise ToolError(f"{where}.function.parameters must be a JSON schema object",
                            param=f"{where}.function.parameters")
        if parameters.get("type", "object") != "object":
            raise ToolError(f"{where}.function.parameters must describe an object, got type "
                            f"{parameters.get('type')!r}", param=f"{where}.function.parameters")
        try:
            check_schema(parameters)
        except ConstraintError as exc:
            raise ToolError(f"{where}.function.parameters: {exc}", param=f"{where}.function.parameters") from exc
        strict = fn.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ToolError(f"{where}.function.strict must be a boolean", param=f"{where}.function.strict")
        description = fn.get("description") or ""
        if not isinstance(description, str):
            raise ToolError(f"{where}.function.description must be a string", param=f"{where}.function.description")
        tools.append(Tool(name, description, {"type": "object", **parameters}, strict))
    return tools


def _named(choice: dict[str, Any], names: list[str], param: str) -> str:
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise ToolError(f"'{param}' must be {{'type': 'function', 'function': {{'name': ...}}}}", param=param)
    if name not in names:
        known = ", ".join(names) or "none"
        raise UnknownToolError(f"'{param}' names function {name!r}, which is not in 'tools' (defined: {known})",
                               param=param)
    return name


def parse_tool_choice(raw: Any, tools: list[Tool], parallel_tool_calls: bool | None = None) -> ToolChoice:
    """OpenAI `tool_choice`: "none" | "auto" | "required" | a named function | allowed_tools."""
    names = [t.name for t in tools]
    parallel = True if parallel_tool_calls is None else parallel_tool_calls
    if not isinstance(parallel, bool):
        raise ToolError("'parallel_tool_calls' must be a boolean", param="parallel_tool_calls")
    max_calls = None if parallel else 1
    if raw is None:
        raw = "auto" if tools else "none"
    if isinstance(raw, str):
        if raw not in ("none", "auto", "required"):
            raise ToolError(f"'tool_choice' must be none, auto, required or a named function, got {raw!r}",
                            param="tool_choice")
        if raw != "none" and not tools:
            raise ToolError(f"'tool_choice' is {raw!r} but no 'tools' are given", param="tool_choice")
        return ToolChoice(raw, tuple(names) if raw != "none" else (), max_calls)
    if not isinstance(raw, dict):
        raise ToolError("'tool_choice' must be a string or an object", param="tool_choice")
    if raw.get("type") == "function":
        return ToolChoice("required", (_named(raw, names, "tool_choice"),), 1)
    if raw.get("type") == "allowed_tools":
        spec = raw.get("allowed_tools")
        if not isinstance(spec, dict) or spec.get("mode") not in ("auto", "required"):
            raise ToolError("'tool_choice.allowed_tools' needs mode auto or required and a list of tools",
                            param="tool_choice.allowed_tools")
        listed = spec.get("tools")
        if not isinstance(listed, list) or not listed:
            raise ToolError("'tool_choice.allowed_tools.tools' must be a non-empty list",
                            param="tool_choice.allowed_tools.tools")
        allowed = tuple(_named(t if isinstance(t, dict) else {}, names, f"tool_choice.allowed_tools.tools[{i}]")
                        for i, t in enumerate(listed))
        return ToolChoice(spec["mode"], allowed, max_calls)
    raise ToolError(f"unsupported 'tool_choice' type {raw.get('type')!r}", param="tool_choice.type")


_REF = re.compile(r"^#(/(?:\$defs|definitions)/)?(.*)$")


def _rehome(schema: Any, prefix: str, where: str) -> Any:
    """Rewrite local `$ref`s of a tool's parameters for their new home under the calls schema's `$defs`;
    `$defs` and `definitions` move there (calls_schema). Only schema keywords are rewritten: a property
    named `definitions`, or a `$ref` string inside a `const`, is the tool's data and stays."""
    if isinstance(schema, list):
        return [_rehome(s, prefix, where) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            match = _REF.match(value)
            assert match is not None
            if not match.group(1) and match.group(2):
                raise ToolError(f"{where}: unsupported $ref {value!r}: only '#', '#/$defs/...' and "
                                "'#/definitions/...'", param=where)
            out[key] = f"#/$defs/{prefix}" + (f"__{match.group(2)}" if match.group(1) else "")
        elif key in ("$defs", "definitions"):
            continue
        elif key in DATA_KEYWORDS:
            out[key] = value
        elif key in SUBSCHEMA_MAPS and isinstance(value, dict):  # names (a property's) are data
            out[key] = {name: _rehome(sub, prefix, where) for name, sub in value.items()}
        else:
            out[key] = _rehome(value, prefix, where)
    return out


def calls_schema(tools: list[Tool], choice: ToolChoice) -> dict[str, Any]:
    """The JSON schema of the call array: each item one permitted tool's name and its arguments."""
    defs: dict[str, Any] = {}
    items = []
    by_name = {t.name: t for t in tools}
    index = {t.name: i for i, t in enumerate(tools)}
    for i, name in enumerate(choice.allowed):
        params = copy.deepcopy(by_name[name].parameters)
        prefix, where = f"tool{i}", f"tools[{index[name]}].function.parameters"
        for key in ("$defs", "definitions"):
            for def_name, sub in (params.get(key) or {}).items():
                defs[f"{prefix}__{def_name}"] = _rehome(sub, prefix, where)
        defs[prefix] = _rehome(params, prefix, where)
        items.append({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": {"$ref": f"#/$defs/{prefix}"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })
    schema: dict[str, Any] = {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items},
                              "minItems": 1}
    if choice.max_calls is not None:
        schema["maxItems"] = choice.max_calls
    schema["$defs"] = defs
    return schema


def new_call_id() -> str:
    alphabet = string.ascii_letters + string.digits
    return "call_" + "".join(secrets.choice(alphabet) for _ in range(24))


def cut_tool_calls(text: str) -> list[ToolCall]:
    """The calls in a call array cut off by max_tokens (`text` follows the marker): every complete call,
    then the last one with its arguments as far as they got (OpenAI's shape for a call cut by `length`).
    A call cut before its arguments began is left out."""
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    i = text.find("[") + 1
    while 0 < i < len(text):
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        try:
            call, i = decoder.raw_decode(text, i)
            calls += tool_calls_from([call])
        except (json.JSONDecodeError, ConstraintError):
            break
    partial = _CUT_CALL.match(text, i) if i > 0 else None
    if partial is not None:
        calls.append(ToolCall(new_call_id(), json.loads(f'"{partial["name"]}"'), partial["arguments"]))
    return calls


# a call object cut inside its arguments; the constrained writer puts "name" first (calls_schema)
_CUT_CALL = re.compile(r'\{\s*"name"\s*:\s*"(?P<name>(?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?P<arguments>.+)\Z',
                       re.DOTALL)


def tool_calls_from(calls: Any) -> list[ToolCall]:
    """OpenAI tool calls, each with a fresh id, from the parsed call array."""
    if not isinstance(calls, list):
        raise ConstraintError("tool call output is not a JSON array of calls")
    out = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ConstraintError(f"malformed tool call {call!r}")
        arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False, separators=(",", ":"))
        out.append(ToolCall(new_call_id(), call["name"], arguments))
    return out


def render_calls(calls: list[dict[str, Any]]) -> str:
    """An assistant message's `tool_calls` as the model writes them (for the conversation history)."""
    items = []
    for call in calls:
        fn = call.get("function") or {}
        arguments = fn.get("arguments") or "{}"
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            parsed = arguments  # history as the client sent it; not ours to fix
        items.append({"name": fn.get("name"), "arguments": parsed})
    return TOOL_CALL_MARKER + json.dumps(items, ensure_ascii=False, separators=(",", ":"))

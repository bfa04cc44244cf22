"""The Chat Completions request, parsed and checked before anything is routed.

Types are checked strictly (a string where a number belongs is a 400 naming the field), unknown fields
are refused (inside messages, tools and response_format too: gateway/shapes.py), and fields draftgate
cannot honour (`n` > 1, `logprobs`, penalties, `logit_bias`, audio, ...) are refused by name when set
to anything but their no-op value: never silently ignored. The values inside messages, tools,
tool_choice and response_format are checked by `decoding` (chat.py, tools.py, structured.py), which
names the offending field the same way.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from decoding.errors import STOP_WITH_STRUCTURE, InvalidRequestError
from decoding.sampling import SEED_MAX, SEED_MIN
from gateway.shapes import strip_response_fields, unknown_field


class RequestError(InvalidRequestError):
    """A request body at fault; `code` says how (invalid_json, unknown_parameter, invalid_type, ...)."""

    def __init__(self, message: str, param: str | None, code: str) -> None:
        super().__init__(message, param=param)
        self.code = code


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)  # deprecated alias of max_completion_tokens
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)  # an extension (vLLM's name)
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)  # what a torch generator takes
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    tools: list[Any] | None = Field(default=None, min_length=1)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: Literal["auto", "default"] | None = None
    speculative: bool | None = None  # draftgate extension: false turns speculation off for this request
    # accepted only at their no-op values (checked in `unsupported`)
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    store: bool | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[Any] | None = None
    function_call: str | dict[str, Any] | None = None

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def passthrough(self) -> dict[str, Any]:
        """The OpenAI fields that were set, for an upstream provider (draftgate's own extensions left out)."""
        return self.model_dump(exclude_none=True, exclude={"speculative", "top_k", "model", "messages"})


# field -> (is its value a no-op?, why draftgate cannot honour anything else)
_UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "n": (lambda v: v in (None, 1), "only n = 1 is supported"),
    "logprobs": (lambda v: not v, "logprobs are not returned by this gateway"),
    "top_logprobs": (lambda v: not v, "logprobs are not returned by this gateway"),
    "presence_penalty": (lambda v: not v, "penalties are not supported (they would change the target's distribution)"),
    "frequency_penalty": (lambda v: not v, "penalties are not supported (they would change the target's distribution)"),
    "logit_bias": (lambda v: not v, "logit_bias is not supported"),
    "store": (lambda v: not v, "draftgate does not store completions"),
    "reasoning_effort": (lambda v: v is None, "the served models do not reason"),
    "verbosity": (lambda v: v is None, "verbosity is not supported"),
    "modalities": (lambda v: v in (None, ["text"]), "only text output is supported"),
    "audio": (lambda v: v is None, "audio output is not supported"),
    "prediction": (lambda v: v is None, "predicted outputs are not supported"),
    "web_search_options": (lambda v: v is None, "web search is not supported"),
    "functions": (lambda v: v is None, "the deprecated 'functions' is not supported: use 'tools'"),
    "function_call": (lambda v: v is None, "the deprecated 'function_call' is not supported: use 'tool_choice'"),
}


def unsupported(request: ChatCompletionRequest) -> RequestError | None:
    """The first field set to a value draftgate cannot honour, as an error naming it."""
    for name, (is_no_op, why) in _UNSUPPORTED.items():
        value = getattr(request, name)
        if not is_no_op(value):
            return RequestError(f"'{name}' = {json.dumps(value)} cannot be honoured: {why}", name,
                                "unsupported_parameter")
    if request.max_tokens is not None and request.max_completion_tokens is not None:  # as OpenAI refuses it
        return RequestError("setting 'max_tokens' and 'max_completion_tokens' at the same time is not supported: "
                            "'max_tokens' is the deprecated name of 'max_completion_tokens'", "max_tokens",
                            "invalid_parameter_combination")
    shaped = isinstance(request.response_format, dict) and request.response_format.get("type") != "text"
    structured = (request.tools and request.tool_choice != "none") or shaped
    if request.stop_sequences and structured:  # on every route: one request surface (README)
        return RequestError(STOP_WITH_STRUCTURE, "stop", "invalid_parameter_combination")
    if request.stream_options is not None and not request.stream:  # as OpenAI: options of a stream not asked for
        return RequestError("'stream_options' is only allowed when 'stream' is true", "stream_options", "invalid_value")
    if isinstance(request.stop, list) and len(request.stop) > 4:
        return RequestError("'stop' takes at most 4 sequences", "stop", "invalid_value")
    if "" in request.stop_sequences:
        return RequestError("'stop' sequences must be non-empty strings", "stop", "invalid_value")
    return None


# fields that take one of several JSON types, and how to say so: pydantic tries each branch and names it
# in the error's location ("stop.str"), which is no field of the request
_UNION_FIELDS = {"stop": "a string or an array of strings", "tool_choice": "a string or an object",
                 "function_call": "a string or an object"}
_BRANCH = {list: "list[", dict: "dict["}


def _one_error(exc: ValidationError, raw: dict[str, Any]) -> tuple[tuple[Any, ...], str, str, Any]:
    """The error to report, as (location, message, kind, the value at fault). For a union field, the
    error of the branch the value's JSON type chose (`stop[1]` in ["a", 5]), else that it has neither type."""
    errors = exc.errors()
    first = errors[0]
    field = first["loc"][0]
    if field not in _UNION_FIELDS or len(first["loc"]) < 2:
        return tuple(first["loc"]), first["msg"].lower(), first["type"], first.get("input")
    value = raw.get(field)
    prefix = next((p for t, p in _BRANCH.items() if isinstance(value, t)), None)
    chosen = next((e for e in errors if e["loc"][0] == field and prefix and str(e["loc"][1]).startswith(prefix)), None)
    if chosen is not None:
        return (field, *chosen["loc"][2:]), chosen["msg"].lower(), chosen["type"], chosen.get("input")
    return (field,), f"must be {_UNION_FIELDS[field]}", "union_type", value


def _param(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# a \uD800-\uDFFF escape: the only way a surrogate gets into parsed JSON (raw ones are invalid UTF-8)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _unpaired_surrogate(value: Any, loc: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
    """Where in a parsed JSON value a string (or key) holds a UTF-16 surrogate with no partner: text no
    tokenizer can encode. json.loads joins a proper pair into one character, so only lone ones remain."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return loc
        return None
    items: Any = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and _unpaired_surrogate(key) is not None:
            return (*loc, key)
        found = _unpaired_surrogate(item, (*loc, key))
        if found is not None:
            return found
    return None


# deeper than any real request (a tool's schema nested 30 objects deep is ~64 levels of the body); the
# checks and the grammar compilers behind them walk a body recursively
MAX_JSON_DEPTH = 64


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` deep in a parsed JSON value (iteratively)."""
    level: list[Any] = [value]  # the containers one level down, level by level (the body itself: level 1)
    for _ in range(limit):
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v if isinstance(v, list) else ())
                 if isinstance(c, (dict, list))]
        if not level:
            return False
    return True


class NotJson(ValueError):
    """A token Python's JSON reader takes and JSON does not have."""


def _not_json(constant: str) -> Any:
    # NaN, Infinity and -Infinity: Python reads them, JSON (RFC 8259) has no such numbers
    raise NotJson(f"{constant} is not a JSON number")


def parse_request(body: bytes) -> ChatCompletionRequest:
    """The request in `body`, or a RequestError naming the first field at fault."""
    try:
        raw = json.loads(body, parse_constant=_not_json)
    except (json.JSONDecodeError, UnicodeDecodeError, NotJson) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}", None, "invalid_json") from exc
    except RecursionError as exc:  # the decoder's own limit, far past ours
        raise RequestError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels", None,
                           "invalid_json") from exc
    if not isinstance(raw, dict):
        raise RequestError("the request body must be a JSON object", None, "invalid_json")
    if _depth_exceeds(raw, MAX_JSON_DEPTH):
        raise RequestError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels", None, "invalid_json")
    if _SURROGATE_ESCAPE.search(body) and (where := _unpaired_surrogate(raw)) is not None:
        # a key can hold the surrogate too: named with it escaped, or the error itself could not be sent
        param = _param(where).encode("utf-8", "backslashreplace").decode() or None
        raise RequestError(f"'{param}' holds an unpaired UTF-16 surrogate (a lone \\ud800-\\udfff escape): "
                           "text must be valid Unicode", param, "invalid_value")
    try:
        request = ChatCompletionRequest.model_validate(raw)
    except ValidationError as exc:
        loc, message, kind, value = _one_error(exc, raw)
        param = _param(loc)
        if kind == "extra_forbidden":
            raise RequestError(f"unknown parameter '{param}'", param, "unknown_parameter") from exc
        if kind == "missing":
            raise RequestError(f"missing required parameter '{param}'", param, "missing_required_parameter") from exc
        if kind == "too_short" and value == []:  # as OpenAI names it
            raise RequestError(f"'{param}' is an empty array: it needs at least one item", param,
                               "empty_array") from exc
        given = json.dumps(value, default=str)[:80]
        raise RequestError(f"'{param}': {message} (got {given})", param, "invalid_type"
                           if kind.endswith("_type") or kind.startswith("literal") else "invalid_value") from exc
    if (nested := unknown_field(request.messages, request.tools, request.response_format)) is not None:
        raise RequestError(f"unknown parameter '{nested}'", nested, "unknown_parameter")
    request.messages = strip_response_fields(request.messages)
    problem = unsupported(request)
    if problem is not None:
        raise problem
    return request

"""Routes served by another provider, through litellm (`openai/<model>` at an `api_base`, a key from
the environment), streaming and not; the provider's errors come back in draftgate's OpenAI envelope.

One call per request: no retries here (the client's SDK retries, and a 429's Retry-After is passed on),
bounded by the policy's `server.request_timeout_s` (504 past it). The provider's own message and `param`
are passed on; its status decides ours: 4xx stays the client's (but 401/403, a gateway's key the
provider refused, is a 502: the client's own key was fine), 5xx and no answer at all are 502s.
"""

from __future__ import annotations

import os
import re

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price list at import

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from gateway.errors import ApiError
from policies.model import UpstreamRoute

log = logging.getLogger(__name__)


class UpstreamError(Exception):
    """A provider's error (or no answer at all), with the status and envelope to pass on."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error", 408: "timeout_error", 422: "invalid_request_error",
          429: "rate_limit_error"}


# what litellm puts before a provider's message: "litellm.BadRequestError: OpenAIException - "
_LITELLM_PREFIX = re.compile(r"^(?:litellm\.\w+: )?(?:\w+Error: )?(?:\w+Exception - )?")


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions it was raised from (litellm wraps the HTTP client's several deep)."""
    out: list[BaseException] = []
    node: BaseException | None = exc
    while node is not None and node not in out and len(out) < 16:
        out.append(node)
        node = node.__cause__ or node.__context__
    return out


def _provider_detail(chain: list[BaseException]) -> dict[str, Any] | None:
    """The provider's own error object: from its HTTP body, or from an error frame mid-stream."""
    for e in chain:
        body = getattr(e, "body", None)
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            return body
    return None


def _provider_status(chain: list[BaseException]) -> int | None:
    """The HTTP status the provider sent: the openai client's own status error holds it (litellm's
    wrappers make statuses up: 500 for anything they cannot place). None: no answer, or mid-stream."""
    import openai

    for e in chain:
        if isinstance(e, openai.APIStatusError) and type(e).__module__.startswith("openai"):
            return e.status_code
    return None


# an error frame mid-stream carries no status: its type says what it would have been
_STATUS_OF_TYPE = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
                   "not_found_error": 404, "rate_limit_error": 429, "timeout_error": 504}


def upstream_error(exc: Exception, model: str, timeout_s: float | None = None) -> UpstreamError:
    import httpx
    import openai

    chain = _chain(exc)
    detail = _provider_detail(chain)
    sent = _provider_status(chain)
    if detail is None and sent is None:  # no answer from the provider
        if any(isinstance(e, openai.APITimeoutError | httpx.TimeoutException | TimeoutError) for e in chain):
            return UpstreamError(ApiError(504, f"upstream for {model!r} did not answer within {timeout_s or 0:g} s",
                                          "timeout_error", "request_timeout"))
        if any(isinstance(e, openai.APIConnectionError | httpx.TransportError | ConnectionError) for e in chain):
            cause = chain[-1]
            return UpstreamError(ApiError(502, f"upstream for {model!r} is unreachable: {cause}", "server_error",
                                          "upstream_unreachable"))
    detail = detail or {}
    message = detail.get("message") or _LITELLM_PREFIX.sub("", str(exc), count=1)
    if isinstance(detail.get("code"), str):
        message += f" (upstream code {detail['code']!r})"
    status = sent if sent is not None else _STATUS_OF_TYPE.get(str(detail.get("type")), 502)
    said = f" ({sent})" if sent is not None else ""
    if status in (408, 504):
        return UpstreamError(ApiError(504, f"upstream for {model!r} timed out{said}: {message}", "timeout_error",
                                      "upstream_timeout"))
    if status >= 500:
        return UpstreamError(ApiError(502, f"upstream for {model!r} failed{said}: {message}", "server_error",
                                      "upstream_error"))
    if status in (401, 403):
        return UpstreamError(ApiError(502, f"upstream for {model!r} refused the gateway's credentials{said}: "
                                      f"{message}", "server_error", "upstream_authentication"))
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    retry_after = headers.get("retry-after")
    param = detail.get("param") if isinstance(detail.get("param"), str) else None
    kind = _TYPES.get(status, "invalid_request_error")
    return UpstreamError(ApiError(status, f"upstream for {model!r}: {message}", kind,
                                  "upstream_" + _TYPES.get(status, "error").removesuffix("_error"), param,
                                  {"Retry-After": retry_after} if retry_after else {}))


# what litellm adds to a provider's answer that OpenAI's never has, or has only when set
_EXTRA = frozenset({"provider_specific_fields"})
_UNSET_EXTRA = frozenset({"function_call", "tool_calls", "audio", "reasoning_content", "thinking_blocks"})
_DETAILS = {"completion_tokens_details": frozenset({"reasoning_tokens", "audio_tokens", "accepted_prediction_tokens",
                                                   "rejected_prediction_tokens"}),
            "prompt_tokens_details": frozenset({"cached_tokens", "audio_tokens"})}


def openai_shape(body: dict[str, Any]) -> dict[str, Any]:
    """A completion or chunk from litellm in OpenAI's shape, as a local route answers: without litellm's
    own fields (`provider_specific_fields`, `text_tokens`) and its nulls for what was never there."""
    for choice in body.get("choices") or []:
        for part in (choice, choice.get("message"), choice.get("delta")):
            if isinstance(part, dict):
                for key in [k for k, v in part.items() if k in _EXTRA or (k in _UNSET_EXTRA and v is None)]:
                    del part[key]
    usage = body.get("usage")
    if isinstance(usage, dict):
        for name, known in _DETAILS.items():
            details = usage.get(name)
            if isinstance(details, dict):
                usage[name] = {k: v for k, v in details.items() if k in known}
            if not usage.get(name):
                usage.pop(name, None)
    return body


def chunk_shape(body: dict[str, Any], include_usage: bool) -> dict[str, Any]:
    """A streamed chunk from litellm (dumped without its nulls) in OpenAI's chunk shape, as a local route
    streams it: `finish_reason` and `logprobs` on every choice, `system_fingerprint` on every chunk, and
    `usage` on every chunk (null but on the usage chunk) when the client asked for usage."""
    body = openai_shape(body)
    body.pop("provider_specific_fields", None)
    body.setdefault("system_fingerprint", None)
    for choice in body.get("choices") or []:
        choice.setdefault("finish_reason", None)
        choice.setdefault("logprobs", None)
    if include_usage:
        body.setdefault("usage", None)
    return body


def _watch_extras(response: Any) -> list[dict[str, Any]]:
    """Fields the provider put on its chunks beyond OpenAI's (a draftgate upstream's `draftgate` object),
    which litellm's chunks drop: read off the provider's own chunks as litellm consumes them, in order."""
    seen: list[dict[str, Any]] = []
    raw = getattr(response, "completion_stream", None)
    if raw is None or not hasattr(raw, "__aiter__"):
        return seen

    async def watched() -> AsyncIterator[Any]:
        async for chunk in raw:
            extra = getattr(chunk, "model_extra", None)
            if extra:
                seen.append(dict(extra))
            yield chunk

    response.completion_stream = watched()
    return seen


def _litellm() -> Any:
    import litellm

    litellm.suppress_debug_info = True  # its "Give Feedback / Get Help" banner on every provider error
    return litellm


# sent to an `api_base` when the route names no key variable: OpenAI clients insist on a key, and a
# local server (vLLM, SGLang, llama.cpp, draftgate) in dev mode takes any
NO_KEY = "no-key"


def missing_key(route: UpstreamRoute) -> str | None:
    """The route's key variable where it names one that is not set (its requests get a 503), else None."""
    return route.api_key_env if route.api_key_env and not os.environ.get(route.api_key_env) else None


def _call_args(route: UpstreamRoute, messages: list[dict[str, Any]], params: dict[str, Any],
               timeout_s: float | None) -> dict[str, Any]:
    args: dict[str, Any] = {"model": route.litellm_model, "messages": messages, **params, "max_retries": 0}
    if timeout_s is not None:
        args["timeout"] = timeout_s
    if route.api_base:
        args["api_base"] = route.api_base
        if not route.api_key_env:
            args["api_key"] = NO_KEY
    if (unset := missing_key(route)) is not None:
        raise UpstreamError(ApiError(503, f"the upstream key variable ${unset} is not set",
                                     "service_unavailable_error", "upstream_key_missing"))
    if route.api_key_env:
        args["api_key"] = os.environ[route.api_key_env]
    return args


async def complete(route: UpstreamRoute, model: str, messages: list[dict[str, Any]],
                   params: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
    """The provider's `chat.completion`, renamed to the route's model."""
    litellm = _litellm()

    try:
        response = await litellm.acompletion(**_call_args(route, messages, {**params, "stream": False}, timeout_s))
    except UpstreamError:
        raise
    except Exception as exc:
        raise upstream_error(exc, model, timeout_s) from exc
    body: dict[str, Any] = response.model_dump()
    body["model"] = model
    return openai_shape(body)


async def stream(route: UpstreamRoute, model: str, messages: list[dict[str, Any]],
                 params: dict[str, Any], timeout_s: float | None = None) -> AsyncIterator[dict[str, Any]]:
    """The provider's chunks, renamed to the route's model, in a local route's chunk shape and with the
    provider's own extra fields kept. The first is awaited before this returns its iterator, so a refused
    request is an HTTP error, not a stream that fails. `timeout_s` bounds the whole stream, not only each
    read: a provider that keeps sending is cut at it (an error frame, `request_timeout`)."""
    litellm = _litellm()
    include_usage = bool((params.get("stream_options") or {}).get("include_usage"))
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s

    async def next_chunk() -> Any:
        if deadline is None:
            return await iterator.__anext__()
        try:
            return await asyncio.wait_for(iterator.__anext__(), max(deadline - loop.time(), 0.0))
        except TimeoutError:
            await _close(response)
            raise UpstreamError(ApiError(504, f"upstream for {model!r} did not complete within {timeout_s:g} s",
                                         "timeout_error", "request_timeout")) from None

    try:
        response = await litellm.acompletion(**_call_args(route, messages, {**params, "stream": True}, timeout_s))
        extras = _watch_extras(response)
        iterator = response.__aiter__()
        first = await next_chunk()
    except StopAsyncIteration:
        first = None
    except UpstreamError:
        raise
    except Exception as exc:
        raise upstream_error(exc, model, timeout_s) from exc

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        pending = first
        while pending is not None:
            body: dict[str, Any] = pending.model_dump(exclude_none=True)
            body["model"] = model
            while extras:  # on the chunk litellm made of the provider's chunk that carried them
                body.update({k: v for k, v in extras.pop(0).items() if k not in body})
            yield chunk_shape(body, include_usage)
            try:
                pending = await next_chunk()
            except StopAsyncIteration:
                return
            except UpstreamError:
                raise
            except Exception as exc:
                raise upstream_error(exc, model, timeout_s) from exc

    return chunks()


async def _close(response: Any) -> None:
    """Let go of a provider's stream (its connection) that is given up on."""
    close = getattr(response, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception as exc:  # it is given up on either way
            log.debug("closing an upstream stream: %s", exc)

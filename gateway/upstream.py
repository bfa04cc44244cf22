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

from collections.abc import AsyncIterator
from typing import Any

from gateway.errors import ApiError
from policies.model import UpstreamRoute


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


def upstream_error(exc: Exception, model: str, timeout_s: float | None = None) -> UpstreamError:
    import httpx
    import openai

    chain = _chain(exc)
    if any(isinstance(e, openai.APITimeoutError | httpx.TimeoutException | TimeoutError) for e in chain):
        return UpstreamError(ApiError(504, f"upstream for {model!r} did not answer within {timeout_s or 0:g} s",
                                      "timeout_error", "request_timeout"))
    if any(isinstance(e, openai.APIConnectionError | httpx.TransportError | ConnectionError) for e in chain):
        cause = chain[-1]
        return UpstreamError(ApiError(502, f"upstream for {model!r} is unreachable: {cause}", "server_error",
                                      "upstream_unreachable"))
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    detail = body if isinstance(body, dict) and isinstance(body.get("message"), str) else {}
    message = detail.get("message") or _LITELLM_PREFIX.sub("", str(exc), count=1)
    if isinstance(detail.get("code"), str):
        message += f" (upstream code {detail['code']!r})"
    if not isinstance(status, int) or status >= 500:
        return UpstreamError(ApiError(502, f"upstream for {model!r} failed ({status}): {message}", "server_error",
                                      "upstream_error"))
    if status in (401, 403):
        return UpstreamError(ApiError(502, f"upstream for {model!r} refused the gateway's credentials ({status}): "
                                      f"{message}", "server_error", "upstream_authentication"))
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    retry_after = headers.get("retry-after")
    param = detail.get("param") if isinstance(detail.get("param"), str) else None
    kind = _TYPES.get(status, "invalid_request_error")
    return UpstreamError(ApiError(status, f"upstream for {model!r}: {message}", kind,
                                  "upstream_" + _TYPES.get(status, "error").removesuffix("_error"), param,
                                  {"Retry-After": retry_after} if retry_after else {}))


# sent to an `api_base` when the route names no key variable: OpenAI clients insist on a key, and a
# local server (vLLM, SGLang, llama.cpp, draftgate) in dev mode takes any
NO_KEY = "no-key"


def _call_args(route: UpstreamRoute, messages: list[dict[str, Any]], params: dict[str, Any],
               timeout_s: float | None) -> dict[str, Any]:
    args: dict[str, Any] = {"model": route.litellm_model, "messages": messages, **params, "max_retries": 0}
    if timeout_s is not None:
        args["timeout"] = timeout_s
    if route.api_base:
        args["api_base"] = route.api_base
        if not route.api_key_env:
            args["api_key"] = NO_KEY
    if route.api_key_env:
        key = os.environ.get(route.api_key_env)
        if not key:
            raise UpstreamError(ApiError(503, f"the upstream key variable ${route.api_key_env} is not set",
                                         "service_unavailable_error", "upstream_key_missing"))
        args["api_key"] = key
    return args


async def complete(route: UpstreamRoute, model: str, messages: list[dict[str, Any]],
                   params: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
    """The provider's `chat.completion`, renamed to the route's model."""
    import litellm

    try:
        response = await litellm.acompletion(**_call_args(route, messages, {**params, "stream": False}, timeout_s))
    except UpstreamError:
        raise
    except Exception as exc:
        raise upstream_error(exc, model, timeout_s) from exc
    body: dict[str, Any] = response.model_dump()
    body["model"] = model
    return body


async def stream(route: UpstreamRoute, model: str, messages: list[dict[str, Any]],
                 params: dict[str, Any], timeout_s: float | None = None) -> AsyncIterator[dict[str, Any]]:
    """The provider's chunks, renamed to the route's model. The first is awaited before this returns
    its iterator, so a refused request is an HTTP error, not a stream that fails."""
    import litellm

    try:
        response = await litellm.acompletion(**_call_args(route, messages, {**params, "stream": True}, timeout_s))
        iterator = response.__aiter__()
        first = await iterator.__anext__()
    except StopAsyncIteration:
        first, iterator = None, None
    except UpstreamError:
        raise
    except Exception as exc:
        raise upstream_error(exc, model, timeout_s) from exc

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        pending = first
        while pending is not None:
            body: dict[str, Any] = pending.model_dump(exclude_none=True)
            body["model"] = model
            yield body
            try:
                pending = await iterator.__anext__()
            except StopAsyncIteration:
                return
            except Exception as exc:
                raise upstream_error(exc, model, timeout_s) from exc

    return chunks()

"""Routes served by another provider, through litellm (`openai/<model>` at an `api_base`, a key from
the environment), streaming and not; the provider's errors come back in draftgate's OpenAI envelope."""

from __future__ import annotations

import os

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


def upstream_error(exc: Exception, model: str) -> UpstreamError:
    import litellm

    status = getattr(exc, "status_code", None)
    if isinstance(exc, litellm.exceptions.APIConnectionError) or not isinstance(status, int):
        return UpstreamError(ApiError(502, f"upstream for {model!r} is unreachable: {exc}", "server_error",
                                      "upstream_unreachable"))
    if status >= 500:
        return UpstreamError(ApiError(502, f"upstream for {model!r} failed ({status}): {exc}", "server_error",
                                      "upstream_error"))
    return UpstreamError(ApiError(status, f"upstream for {model!r}: {exc}", _TYPES.get(status, "invalid_request_error"),
                                  "upstream_" + _TYPES.get(status, "error").removesuffix("_error")))


def _call_args(route: UpstreamRoute, messages: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = {"model": route.litellm_model, "messages": messages, **params}
    if route.api_base:
        args["api_base"] = route.api_base
    if route.api_key_env:
        key = os.environ.get(route.api_key_env)
        if not key:
            raise UpstreamError(ApiError(503, f"the upstream key variable ${route.api_key_env} is not set",
                                         "service_unavailable_error", "upstream_key_missing"))
        args["api_key"] = key
    return args


async def complete(route: UpstreamRoute, model: str, messages: list[dict[str, Any]],
                   params: dict[str, Any]) -> dict[str, Any]:
    """The provider's `chat.completion`, renamed to the route's model."""
    import litellm

    try:
        response = await litellm.acompletion(**_call_args(route, messages, {**params, "stream": False}))
    except UpstreamError:
        raise
    except Exception as exc:
        raise upstream_error(exc, model) from exc
    body: dict[str, Any] = response.model_dump()
    body["model"] = model
    return body


async def stream(route: UpstreamRoute, model: str, messages: list[dict[str, Any]],
                 params: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """The provider's chunks, renamed to the route's model. The first is awaited before this returns
    its iterator, so a refused request is an HTTP error, not a stream that fails."""
    import litellm

    try:
        response = await litellm.acompletion(**_call_args(route, messages, {**params, "stream": True}))
        iterator = response.__aiter__()
        first = await iterator.__anext__()
    except StopAsyncIteration:
        first, iterator = None, None
    except UpstreamError:
        raise
    except Exception as exc:
        raise upstream_error(exc, model) from exc

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
                raise upstream_error(exc, model) from exc

    return chunks()

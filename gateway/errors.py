"""Every error draftgate raises on purpose, as an OpenAI error envelope with the right HTTP status.

`{"error": {"message", "type", "param", "code"}}`, with the status deciding the client's exception
class: 400 for a request at fault (not retried), 404 for an unknown model, 422 for
an output that failed its own check, 5xx for the server. The HTTP layer calls `error_response` and
nothing else, so no error leaves as a bare 500 with a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from decoding.constraints.base import ConstraintError
from decoding.errors import DecodingError, InvalidRequestError, ModelLoadError
from decoding.structured import OutputValidationError


@dataclass(frozen=True)
class ApiError:
    status: int
    message: str
    type: str
    code: str | None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class UnknownModelError(Exception):
    """A `model` no route serves."""

    code = "model_not_found"

    def __init__(self, model: str, known: list[str]) -> None:
        super().__init__(f"the model {model!r} does not exist here (routed: {', '.join(known) or 'none'})")
        self.param = "model"


class BodyTooLargeError(Exception):
    code = "request_too_large"

    def __init__(self, size: int, limit: int, complete: bool = True) -> None:
        told = f"{size} bytes" if complete else f"more than {limit} bytes ({size} read)"
        super().__init__(f"the request body is {told}; this gateway takes at most {limit}")
        self.param = None


def to_api_error(exc: Exception) -> ApiError:
    """The envelope for `exc`; anything unforeseen is a 500 that says so, without internals."""
    from gateway.auth import AuthError
    from gateway.local import QueueFullError, RequestTimeoutError
    from gateway.upstream import UpstreamError

    param = getattr(exc, "param", None)
    code = getattr(exc, "code", None)
    if isinstance(exc, UpstreamError):
        return exc.error
    if isinstance(exc, AuthError):
        return ApiError(401, str(exc), "invalid_request_error", exc.code)
    if isinstance(exc, QueueFullError):
        return ApiError(429, str(exc), "rate_limit_error", exc.code, None,
                        {"Retry-After": str(exc.retry_after_s), "x-should-retry": "true"})
    if isinstance(exc, RequestTimeoutError):
        return ApiError(504, str(exc), "timeout_error", exc.code)
    if isinstance(exc, BodyTooLargeError):
        return ApiError(413, str(exc), "invalid_request_error", exc.code)
    if isinstance(exc, UnknownModelError):
        return ApiError(404, str(exc), "invalid_request_error", exc.code, exc.param)
    if isinstance(exc, OutputValidationError):
        return ApiError(422, str(exc), "invalid_request_error", code, param)
    if isinstance(exc, InvalidRequestError | ConstraintError):  # a too-complex schema included
        return ApiError(400, str(exc), "invalid_request_error", code, param)
    if isinstance(exc, ModelLoadError):
        return ApiError(503, str(exc), "service_unavailable_error", code, param)
    if isinstance(exc, DecodingError):
        return ApiError(500, str(exc), "server_error", code, param)
    return ApiError(500, f"internal error ({type(exc).__name__}); see the server log", "server_error",
                    "internal_error")

"""The FastAPI app, built by `create_app` from a policy; its state lives on `app.state.gateway`.

Endpoints: `POST /v1/chat/completions`, `GET /v1/models`, `GET /health` (and `/healthz`). Every error,
ours (through `failure`) or the framework's (unknown path, wrong method), leaves as an OpenAI envelope.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from gateway.auth import AuthError
from gateway.chat import ClientGone, chat_completions
from gateway.errors import ApiError, BodyTooLargeError, UnknownModelError, to_api_error
from gateway.protocol import parse_request
from gateway.state import GatewayState
from gateway.upstream import missing_key
from policies.model import Policy, Route

log = logging.getLogger(__name__)


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def failure(exc: Exception) -> JSONResponse:
    error = to_api_error(exc)
    if error.code == "internal_error":  # a fault of ours: the traceback is what finds it
        log.error("request failed: %s", exc, exc_info=exc)
    elif error.status >= 500:  # timeouts, a provider's failure: expected outcomes, one line each
        log.warning("request failed: %s %s: %s", error.status, error.code, error.message)
    return error_response(error)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it passes `limit` bytes: by its declared length, or, sent
    in chunks, before more than a chunk past the limit is held."""
    declared = (request.headers.get("content-length") or "").strip()
    if declared.isdigit() and int(declared) > limit:  # (a length that is no number: the count below decides)
        raise BodyTooLargeError(int(declared), limit)
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError(size, limit, complete=False)
        parts.append(chunk)
    return b"".join(parts)


SERVED = "this gateway serves POST /v1/chat/completions, GET /v1/models, GET /v1/models/{model} and GET /health"


def create_app(policy: Policy, state: GatewayState | None = None) -> FastAPI:
    """The gateway for `policy`; loads every local route's model unless a built `state` is given."""
    gateway = state or GatewayState.build(policy)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        gateway.close()

    # no docs or schema endpoints: everything served is the OpenAI API (behind its keys) and /health
    app = FastAPI(title="draftgate", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None, redirect_slashes=False)
    app.state.gateway = gateway

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = str(exc.detail)
        if exc.status_code in (404, 405):  # as OpenAI words it, and what is served here
            message = f"Invalid URL ({request.method} {request.url.path}): {message.lower()}; {SERVED}"
        return error_response(ApiError(exc.status_code, message, "invalid_request_error", code,
                                       headers=dict(exc.headers or {})))  # a 405's Allow

    @app.post("/v1/chat/completions")
    @app.post("/v1/chat/completions/")  # served, not redirected: a 307's Location names the Host header's host
    async def chat(request: Request) -> Response:
        try:
            return await _chat(request)
        except (ClientGone, ClientDisconnect):  # left while queued or decoding, or before its body was read
            return Response(status_code=499)  # nobody is listening; nginx's "client closed request"
        except Exception as exc:  # the one place errors become responses (a handler would re-raise them)
            return failure(exc)

    async def _chat(request: Request) -> Response:
        gateway.keys.check(request.headers.get("authorization"))
        body = await read_body(request, gateway.policy.server.max_body_bytes)
        return await chat_completions(gateway, parse_request(body), request)

    def model_card(route: Route) -> dict[str, Any]:
        return {"id": route.model, "object": "model", "created": gateway.started,
                "owned_by": "draftgate" if route.local is not None else "upstream"}

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        try:
            gateway.keys.check(request.headers.get("authorization"))
        except Exception as exc:
            return failure(exc)
        return JSONResponse({"object": "list", "data": [model_card(r) for r in gateway.policy.routes]})

    @app.get("/v1/models/{model:path}")  # :path: a model id may hold slashes ("org/name")
    async def model(request: Request, model: str) -> Response:
        if not model:  # /v1/models/: the list
            return await models(request)
        try:
            gateway.keys.check(request.headers.get("authorization"))
            route = gateway.policy.route(model)
            if route is None:
                raise UnknownModelError(model, [r.model for r in gateway.policy.routes])
        except Exception as exc:
            return failure(exc)
        return JSONResponse(model_card(route))

    @app.api_route("/health", methods=["GET", "HEAD"])
    @app.api_route("/healthz", methods=["GET", "HEAD"])
    async def health(request: Request) -> dict[str, Any]:
        # open to a load balancer's probe; the routes (upstream model names, queues) only to a key holder
        try:
            gateway.keys.check(request.headers.get("authorization"))
        except AuthError:
            return {"status": "ok"}
        return {"status": "ok", "models": {r.model: route_health(r) for r in gateway.policy.routes}}

    def route_health(route: Route) -> dict[str, Any]:
        if route.local is not None:
            return {"route": "local", "queued": gateway.local[route.model].queued}
        assert route.upstream is not None
        unset = missing_key(route.upstream)
        return {"route": "upstream", "litellm_model": route.upstream.litellm_model, "ready": unset is None,
                **({"problem": f"${unset} is not set: requests get 503 upstream_key_missing"} if unset else {})}

    return app

"""The HTTP layer in process (an upstream-only policy: no model loads): body limits, a wrong method, and
what an upstream route refuses before calling out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx

from gateway.app import create_app
from gateway.state import GatewayState
from policies.loader import parse_policy

POLICY = """\
version: 1
auth: {dev: true}
server: {max_body_bytes: 1000}
routes:
  - model: remote
    upstream: {litellm_model: openai/x, api_base: "http://127.0.0.1:9/v1"}
"""


def _call(send: dict) -> tuple[httpx.Response, int]:
    """One request to the app; the number of body chunks the client was asked for."""
    policy = parse_policy(POLICY, "p.yaml")
    app = create_app(policy, GatewayState.build(policy))
    pulled = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(50):
            pulled += 1
            yield b"x" * 100_000

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            content = chunks() if send.get("chunked") else send.get("content")
            return await client.request(send.get("method", "POST"), send.get("path", "/v1/chat/completions"),
                                        content=content, headers=send.get("headers"))

    return asyncio.run(run()), pulled


def test_a_chunked_body_past_the_limit_is_refused_before_it_is_all_read() -> None:
    """A body without Content-Length (sent in chunks) was read whole before its size was checked: 5 MB
    held for a limit of 1,000 bytes."""
    response, pulled = _call({"chunked": True})
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert "more than 1000 bytes" in response.json()["error"]["message"]
    assert pulled == 1  # of 50 chunks the client had to send


def test_a_declared_length_past_the_limit_is_refused_and_a_small_body_is_read() -> None:
    response, _ = _call({"content": b"{" * 1001})
    assert response.status_code == 413 and "is 1001 bytes" in response.json()["error"]["message"]
    small, _ = _call({"content": b"{"})
    assert small.status_code == 400 and small.json()["error"]["code"] == "invalid_json"  # read, then parsed


def test_a_wrong_method_is_a_405_with_allow() -> None:
    response, _ = _call({"method": "POST", "path": "/v1/models"})
    assert response.status_code == 405 and response.headers["allow"] == "GET"
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_top_k_on_an_upstream_route_is_refused_before_any_call() -> None:
    """The providers behind litellm do not take it, and dropping it would change the distribution asked for."""
    body = b'{"model": "remote", "messages": [{"role": "user", "content": "hi"}], "top_k": 5}'
    response, _ = _call({"content": body})
    error = response.json()["error"]
    assert response.status_code == 400 and (error["code"], error["param"]) == ("unsupported_parameter", "top_k")
    unreachable, _ = _call({"content": body.replace(b', "top_k": 5', b"")})
    assert unreachable.status_code == 502  # without it the request goes on (to a closed port here)

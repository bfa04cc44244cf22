"""Upstream routes against a real provider-shaped HTTP server on loopback. Failures: one call per
request (no retries behind the client's back), the provider's message, param and Retry-After passed on,
no answer within the policy's timeout a 504, a closed port `upstream_unreachable`. Answers: a local
route's shape, streamed or not, with the provider's own extra fields kept."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.state import GatewayState
from gateway.upstream import NO_KEY, UpstreamError, complete, stream
from policies.loader import parse_policy
from policies.model import UpstreamRoute

ERROR = {"error": {"message": "messages[0] is not a message", "type": "invalid_request_error", "param": "messages",
                   "code": "bad_message"}}
STATUS = {"e400": 400, "e401": 401, "e429": 429, "e500": 500, "e504": 504}
# what a provider (draftgate among them) answers when its own request timeout ran out
TIMED_OUT = {"error": {"message": "the request did not complete within 3 s", "type": "timeout_error", "param": None,
                       "code": "request_timeout"}}
CHUNK = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "ok",
         "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
# failures after the stream began: the status is sent, the error arrives as a frame
INVALID = {"error": {"message": "output does not match the schema: 'x' is not a 'email'",
                     "type": "invalid_request_error", "param": None, "code": "output_validation_failed"}}
FRAMES = {"mid-invalid": INVALID, "mid-timeout": TIMED_OUT}
# a draftgate upstream's stream: nulls where OpenAI sends nulls, its statistics on the usage chunk
STREAMED = [{**CHUNK, "system_fingerprint": None, "usage": None,
             "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None, "logprobs": None}]}
            for text in ("h", "i")] + [
    {**CHUNK, "system_fingerprint": None, "usage": None,
     "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": None}]},
    {**CHUNK, "system_fingerprint": None, "choices": [], "draftgate": {"target_passes": 2},
     "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}]
OK = {"id": "c1", "object": "chat.completion", "created": 1, "model": "ok",
      "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
      "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class Provider(BaseHTTPRequestHandler):
    calls: ClassVar[list[tuple[str, str | None]]] = []  # (model, authorization) of every request received

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        model = body["model"]
        Provider.calls.append((model, self.headers.get("authorization")))
        if model == "slow":
            time.sleep(3)  # the client gave up long ago: nothing to answer, and no broken pipe printed later
            return
        if model == "trickle":  # a chunk every 0.2 s for 4 s: each read is quick, the whole is not
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            try:
                for _ in range(20):
                    self.wfile.write(f"data: {json.dumps(CHUNK)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:  # the gateway let go of the stream
                pass
            return
        if model in FRAMES or model == "streamed":
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            for frame in STREAMED if model == "streamed" else (CHUNK, FRAMES[model]):
                self.wfile.write(f"data: {json.dumps(frame)}\n\n".encode())
            if model == "streamed":
                self.wfile.write(b"data: [DONE]\n\n")
            return
        status = STATUS.get(model, 200)
        data = json.dumps((TIMED_OUT if status == 504 else ERROR) if status != 200 else OK).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        if status == 429:
            self.send_header("retry-after", "7")
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Provider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def _ask(base: str, model: str, timeout_s: float | None = None) -> UpstreamError | dict:
    route = UpstreamRoute(f"openai/{model}", base)
    Provider.calls.clear()
    try:
        return asyncio.run(complete(route, "remote", [{"role": "user", "content": "hi"}], {}, timeout_s))
    except UpstreamError as exc:
        return exc


def test_a_keyless_route_to_an_api_base_is_answered(provider: str) -> None:
    body = _ask(provider, "ok")
    assert isinstance(body, dict) and body["model"] == "remote" and body["choices"][0]["message"]["content"] == "hi"
    # OpenAI's shape, as a local route answers: none of litellm's own fields or nulls
    message = {"role": "assistant", "content": "hi"}
    assert body["choices"][0] == {"index": 0, "finish_reason": "stop", "message": message}
    assert body["usage"] == {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    assert Provider.calls == [("ok", f"Bearer {NO_KEY}")]


@pytest.mark.parametrize(("model", "status", "code"), [
    ("e400", 400, "upstream_invalid_request"),
    ("e429", 429, "upstream_rate_limit"),
    ("e401", 502, "upstream_authentication"),  # the gateway's key was refused, not the client's
    ("e500", 502, "upstream_error"),
])
def test_a_provider_error_is_passed_on_after_one_call(provider: str, model: str, status: int, code: str) -> None:
    exc = _ask(provider, model)
    assert isinstance(exc, UpstreamError)
    assert exc.error.status == status and exc.error.code == code
    assert "messages[0] is not a message" in exc.error.message
    assert "litellm" not in exc.error.message and "Exception" not in exc.error.message
    assert len(Provider.calls) == 1  # no retries behind the client's back
    if status == 400:
        assert exc.error.param == "messages" and "(upstream code 'bad_message')" in exc.error.message
    if status == 429:
        assert exc.error.headers == {"Retry-After": "7"}


def test_no_answer_within_the_timeout_is_a_504(provider: str) -> None:
    exc = _ask(provider, "slow", timeout_s=0.5)  # the provider sleeps 3 s, then answers
    assert isinstance(exc, UpstreamError) and exc.error.status == 504 and exc.error.code == "request_timeout"


def test_the_providers_own_timeout_is_its_answer_not_ours(provider: str) -> None:
    exc = _ask(provider, "e504", timeout_s=30)
    assert isinstance(exc, UpstreamError) and exc.error.status == 504 and exc.error.code == "upstream_timeout"
    assert "did not complete within 3 s" in exc.error.message and "30 s" not in exc.error.message


def _stream_error(base: str, model: str, params: dict | None = None,
                  timeout_s: float = 30) -> tuple[list[dict], UpstreamError | None]:
    async def run() -> tuple[list[dict], UpstreamError | None]:
        chunks: list[dict] = []
        try:
            async for body in await stream(UpstreamRoute(f"openai/{model}", base), "remote",
                                           [{"role": "user", "content": "hi"}], params or {}, timeout_s):
                chunks.append(body)
        except UpstreamError as exc:
            return chunks, exc
        return chunks, None
    return asyncio.run(run())


@pytest.mark.parametrize(("model", "code"), [("mid-invalid", "upstream_invalid_request"),
                                             ("mid-timeout", "upstream_timeout")])
def test_an_error_frame_mid_stream_keeps_the_providers_message_once_and_its_kind(provider: str, model: str,
                                                                                 code: str) -> None:
    chunks, exc = _stream_error(provider, model)
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == ["hi"] and chunks[0]["model"] == "remote"
    assert set(chunks[0]["choices"][0]) == {"index", "delta", "finish_reason", "logprobs"}  # no litellm fields
    assert exc is not None and exc.error.code == code
    provider_message = FRAMES[model]["error"]["message"]
    assert exc.error.message.count(provider_message) == 1
    assert "litellm" not in exc.error.message and "(500)" not in exc.error.message

def test_a_stream_comes_back_in_a_local_routes_chunk_shape_with_the_providers_extras(provider: str) -> None:
    chunks, exc = _stream_error(provider, "streamed", {"stream_options": {"include_usage": True}})
    assert exc is None and [c["model"] for c in chunks] == ["remote"] * 4
    choices = [c["choices"][0] for c in chunks[:3]]
    assert [c["delta"].get("content") for c in choices] == ["h", "i", None]
    assert [(c["finish_reason"], c["logprobs"]) for c in choices] == [(None, None), (None, None), ("stop", None)]
    assert all(set(c) >= {"id", "object", "created", "system_fingerprint", "usage"} for c in chunks)
    assert [c["usage"] for c in chunks[:3]] == [None] * 3 and chunks[3]["usage"]["completion_tokens"] == 2
    # the upstream's own statistics ride on its last chunk, as they would from a local route
    assert [c.get("draftgate") for c in chunks] == [None, None, None, {"target_passes": 2}]


def test_a_stream_that_runs_past_the_timeout_is_cut_there(provider: str) -> None:
    """The timeout bounded each read only: a provider that kept sending could stream for ever (a review)."""
    chunks, exc = _stream_error(provider, "trickle", timeout_s=1.0)
    assert exc is not None and (exc.error.status, exc.error.code) == (504, "request_timeout")
    assert 2 <= len(chunks) <= 7  # ~5 chunks in 1 s, not the 20 it sends over 4 s


def test_a_closed_port_is_unreachable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        exc = _ask(f"http://127.0.0.1:{port}/v1", "ok")
    assert isinstance(exc, UpstreamError) and exc.error.status == 502 and exc.error.code == "upstream_unreachable"


def test_an_unset_key_variable_is_said_at_startup(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("DRAFTGATE_TEST_UNSET_KEY", raising=False)
    policy = parse_policy("version: 1\nauth: {dev: true}\nroutes:\n  - model: up\n    upstream: {litellm_model: "
                          "openai/x, api_base: 'http://127.0.0.1:9/v1', api_key_env: DRAFTGATE_TEST_UNSET_KEY}\n",
                          "up.yaml")
    with caplog.at_level("WARNING"):
        state = GatewayState.build(policy)
    assert "route up: $DRAFTGATE_TEST_UNSET_KEY is not set" in caplog.text
    with TestClient(create_app(policy, state)) as client:  # and /health says so to a key holder
        health = client.get("/health", headers={"Authorization": "Bearer any"}).json()
    assert health["models"]["up"]["ready"] is False
    assert health["models"]["up"]["problem"] == ("$DRAFTGATE_TEST_UNSET_KEY is not set: requests get 503 "
                                                 "upstream_key_missing")

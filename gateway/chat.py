"""`POST /v1/chat/completions`: a parsed request to its route — the local engine or an upstream provider.

Local: prepared (every request error is a 400 before any queueing), queued, then either collected into
one `chat.completion` or streamed as chunks. Tool calls are held back while the text could still be
one, then sent as tool-call deltas once parsed and validated.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from decoding.chat_engine import ChatRequest
from decoding.constraints.spec import could_be_call
from decoding.generate import GenerationConfig
from decoding.sampling import SamplingParams
from gateway import upstream
from gateway.errors import UnknownModelError, to_api_error
from gateway.local import Done, Job, LocalModel
from gateway.protocol import ChatCompletionRequest, RequestError
from gateway.responses import DONE, ChunkWriter, completion, completion_id, draftgate_stats, sse, usage
from gateway.state import GatewayState

DEFAULT_MAX_TOKENS = 1024  # when the client sets none (cut further to what the context leaves)
OPENAI_DEFAULT_TEMPERATURE = 1.0

DISCONNECT_CHECK_S = 0.5  # how often a non-streamed request looks for a client that went away

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    """The client disconnected before its completion was ready."""


async def chat_completions(state: GatewayState, req: ChatCompletionRequest, request: Request) -> Response:
    route = state.policy.route(req.model)
    if route is None:
        raise UnknownModelError(req.model, [r.model for r in state.policy.routes])
    if route.upstream is not None:
        if req.top_k:  # it would change the distribution: never dropped in silence
            raise RequestError(f"'top_k' is a draftgate extension of its local routes; the upstream route "
                               f"{req.model!r} does not take it", "top_k", "unsupported_parameter")
        params, timeout_s = req.passthrough(), state.policy.server.request_timeout_s
        if req.stream:
            chunks = await upstream.stream(route.upstream, req.model, req.messages, params, timeout_s)
            return StreamingResponse(_upstream_frames(chunks), media_type="text/event-stream", headers=SSE_HEADERS)
        return JSONResponse(await upstream.complete(route.upstream, req.model, req.messages, params, timeout_s))
    assert route.local is not None
    local = state.local[req.model]
    speculative = route.local.speculative.enabled and req.speculative is not False
    job = await local.admit(chat_request(req, speculative))
    prepared = job.prepared
    if req.stream:
        writer = ChunkWriter(req.model, req.include_usage)
        frames = _local_frames(local, job, writer, prepared.plan.calls is not None, speculative)
        return StreamingResponse(frames, media_type="text/event-stream", headers=SSE_HEADERS)
    done = await _collect(local, job, request)
    out, result = done.output, done.result
    return JSONResponse(completion(completion_id(), req.model, out.content, out.tool_calls, out.finish_reason,
                                   usage(result), draftgate_stats(result, speculative, done.queued_s)))


def chat_request(req: ChatCompletionRequest, speculative: bool) -> ChatRequest:
    temperature = OPENAI_DEFAULT_TEMPERATURE if req.temperature is None else req.temperature
    sampling = SamplingParams(temperature=temperature, top_p=1.0 if req.top_p is None else req.top_p,
                              top_k=req.top_k or 0, seed=req.seed)
    limit = req.max_new_tokens
    config = GenerationConfig(max_new_tokens=DEFAULT_MAX_TOKENS if limit is None else limit, sampling=sampling,
                              stop=req.stop_sequences, speculative=speculative)
    return ChatRequest(req.messages, config, tools=req.tools, tool_choice=req.tool_choice,
                       parallel_tool_calls=req.parallel_tool_calls, response_format=req.response_format,
                       fit_max_tokens=limit is None,
                       limit_field="max_tokens" if req.max_completion_tokens is None else "max_completion_tokens")


async def _collect(local: LocalModel, job: Job, request: Request) -> Done:
    checked = time.monotonic()
    async for item in local.events(job):
        if isinstance(item, Done):
            return item
        # while queued, events() ticks with None; while decoding, text arrives at every step: check the
        # client on both, at most every DISCONNECT_CHECK_S
        now = time.monotonic()
        if item is None or now - checked >= DISCONNECT_CHECK_S:
            checked = now
            if await request.is_disconnected():
                raise ClientGone()  # leaving events() cancels the generation
    raise AssertionError("events() ends with Done")


async def _local_frames(local: LocalModel, job: Job, writer: ChunkWriter, tools: bool,
                        speculative: bool) -> AsyncIterator[bytes]:
    # OpenAI opens a reply that may be tool calls with content null, a text reply with "" (the SDKs'
    # stream helpers keep what the first delta says)
    yield writer.chunk({"role": "assistant", "content": None if tools else ""})
    held = ""  # text that may still turn out to be a tool call
    streaming_text = not tools
    try:
        async for item in local.events(job):
            if item is None:
                yield b": keep-alive\n\n"  # an SSE comment: clients ignore it; a gone client fails the send
            elif isinstance(item, str):
                if streaming_text:
                    yield writer.chunk({"content": item})
                    continue
                held += item
                if not could_be_call(held):
                    streaming_text = True
                    yield writer.chunk({"content": held})
                    held = ""
            else:
                out, result = item.output, item.result
                if out.tool_calls:
                    for frame in writer.tool_call_chunks(out.tool_calls):
                        yield frame
                elif held and out.content is not None:  # (None: a call cut before its arguments)
                    yield writer.chunk({"content": held})
                for frame in writer.final(out.finish_reason, usage(result),
                                          draftgate_stats(result, speculative, item.queued_s)):
                    yield frame
                yield DONE
    except Exception as exc:  # headers are sent: the error goes in the stream
        yield sse(to_api_error(exc).body())


async def _upstream_frames(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    try:
        async for body in chunks:
            yield sse(body)
        yield DONE
    except Exception as exc:
        yield sse(to_api_error(exc).body())

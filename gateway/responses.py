"""OpenAI response shapes: `chat.completion`, `chat.completion.chunk`, usage, SSE frames, and the
`draftgate` extension object with the request's speculative-decoding statistics."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from decoding.generate import GenerationResult
from decoding.tools import ToolCall


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")


def usage(result: GenerationResult) -> dict[str, Any]:
    """OpenAI's usage; `cached_tokens`: prompt tokens read from the cache the route's previous request
    left (decoding.generate.Engine.reusable_prefix), as OpenAI reports its prompt caching."""
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": result.stats.cached_prompt_tokens}}


def draftgate_stats(result: GenerationResult, speculative: bool, queued_s: float) -> dict[str, Any]:
    """Per-request speculation: drafted, accepted, acceptance rate, mean acceptance length, passes."""
    s = result.stats
    decode_tokens = max(result.completion_tokens - 1, 0)
    return {
        "speculative": speculative,
        "draft_tokens": s.draft_tokens,
        "accepted_tokens": s.accepted_tokens,
        "acceptance_rate": round(s.acceptance_rate, 4),
        "mean_acceptance_length": round(s.mean_acceptance_length, 4),
        "target_passes": s.target_passes,
        "verify_passes": s.verify_passes,
        "by_drafter": {name: {"drafted": d, "accepted": a} for name, (d, a) in sorted(s.by_source.items())},
        "queue_s": round(queued_s, 4),
        "ttft_s": round(result.prefill_s, 4),
        "decode_tokens_per_s": round(decode_tokens / result.decode_s, 2) if result.decode_s > 0 else None,
    }


def completion(cid: str, model: str, content: str | None, tool_calls: list[ToolCall], finish_reason: str,
               usage_: dict[str, Any] | None, extension: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = [c.to_openai() for c in tool_calls]
    body: dict[str, Any] = {
        "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": usage_, "system_fingerprint": None, "service_tier": None,
    }
    if extension is not None:
        body["draftgate"] = extension
    return body


class ChunkWriter:
    """The chunks of one streamed completion: same id and created on each; usage null on each but the
    usage chunk when the client asked for usage."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.id = completion_id()
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    def _body(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                "model": self.model, "system_fingerprint": None, "choices": choices}
        if self.include_usage:
            body["usage"] = None
        return body

    def _delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return self._body([{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}])

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return sse(self._delta(delta, finish_reason))

    def tool_call_chunks(self, calls: list[ToolCall]) -> list[bytes]:
        """Per call: a delta with index, id, type and name, then one with its arguments."""
        out = []
        for i, call in enumerate(calls):
            out.append(self.chunk({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                                   "function": {"name": call.name, "arguments": ""}}]}))
            out.append(self.chunk({"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]}))
        return out

    def final(self, finish_reason: str, usage_: dict[str, Any], extension: dict[str, Any] | None) -> list[bytes]:
        """The finish chunk, then (when asked) the usage chunk; the extension rides on the last of them."""
        bodies = [self._delta({}, finish_reason)]
        if self.include_usage:
            bodies.append({**self._body([]), "usage": usage_})
        if extension is not None:
            bodies[-1]["draftgate"] = extension
        return [sse(b) for b in bodies]

"""`draftgate bench --gateway`: what the HTTP layer costs, and speculation on vs off through it.

1. Overhead: the same one-token request, alternately as a direct `ChatEngine` call and over HTTP to the
   gateway on loopback (keep-alive client, as an SDK uses): the median of the per-pair differences is
   the gateway's cost (HTTP, parsing, queue hand-off, serialisation).
2. Speculation through the API: each workload prompt, greedy, with `"speculative": false` and with the
   route's default (on), side by side: the texts must be identical; the ratio is the speedup a client sees.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

from decoding.bench.workload import load_workload
from decoding.chat_engine import ChatRequest
from decoding.generate import GenerationConfig
from gateway.app import create_app
from gateway.state import GatewayState
from policies.loader import PolicyError, load_policy


@dataclass(frozen=True)
class GatewayBenchOptions:
    policy: str | None = None
    model: str | None = None  # None: the policy's first local route
    requests: int = 40
    quick: bool = False
    max_new_tokens: int = 64


class _Server:
    """The gateway app under uvicorn in a thread, on a free loopback port."""

    def __init__(self, app: Any) -> None:
        import socket

        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def _ms(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50": round(statistics.median(xs) * 1000, 3), "p90": round(xs[int(0.9 * (len(xs) - 1))] * 1000, 3),
            "mean": round(statistics.fmean(xs) * 1000, 3)}


def run_gateway_bench(options: GatewayBenchOptions) -> dict[str, Any]:
    policy = load_policy(options.policy)
    local = [r.model for r in policy.routes if r.local is not None]
    model = options.model or (local[0] if local else None)
    if model not in local:
        raise PolicyError(options.policy or "the shipped policy", None, "routes",
                          f"no local route {model!r} to bench (local routes: {', '.join(local) or 'none'})"
                          if model else "no local route to bench")
    state = GatewayState.build(policy)
    chat = state.local[model].chat
    # each prompt runs twice, speculation off then on: the second would read the first's prompt from the
    # cache (decoding.generate.Engine.reusable_prefix) and skip its processing, so both read it whole
    chat.engine.reuse_prefixes = False
    messages = [{"role": "user", "content": "Hi"}]
    one_token = {"model": model, "messages": messages, "max_tokens": 1, "temperature": 0}
    direct_config = GenerationConfig(max_new_tokens=1)
    report: dict[str, Any] = {"model": model}
    # a policy with API keys: the bench's client sends one of them
    auth = {} if state.keys.dev else {"Authorization": f"Bearer {min(state.keys.keys)}"}
    with (_Server(create_app(policy, state)) as url,
          httpx.Client(base_url=url, timeout=600, headers=auth) as client):
        def direct() -> float:
            started = time.perf_counter()
            chat.complete(ChatRequest(messages, direct_config))
            return time.perf_counter() - started

        def http(body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
            started = time.perf_counter()
            response = client.post("/chat/completions", json=body)
            elapsed = time.perf_counter() - started
            response.raise_for_status()
            return elapsed, response.json()

        for _ in range(3):  # warm both paths
            direct()
            http(one_token)
        direct_s, http_s = [], []
        for _ in range(options.requests):
            direct_s.append(direct())
            http_s.append(http(one_token)[0])
        report["overhead"] = {
            "requests": options.requests,
            "direct_ms": _ms(direct_s), "http_ms": _ms(http_s),
            "overhead_p50_ms": round(statistics.median(h - d for h, d in zip(http_s, direct_s, strict=True)) * 1000, 3),
        }
        rows = []
        for prompt in load_workload(options.quick):
            body = {"model": model, "messages": prompt.messages, "max_tokens": options.max_new_tokens,
                    "temperature": 0}
            off_s, off = http({**body, "speculative": False})
            on_s, on = http(body)
            tokens = on["usage"]["completion_tokens"]
            rows.append({"id": prompt.id, "category": prompt.category, "tokens": tokens,
                         "off_s": round(off_s, 4), "on_s": round(on_s, 4),
                         "same_text": on["choices"][0]["message"]["content"] == off["choices"][0]["message"]["content"],
                         "mean_acceptance_length": on["draftgate"]["mean_acceptance_length"]})
    state.close()
    by_category: dict[str, dict[str, Any]] = {}
    for category in [*sorted({r["category"] for r in rows}), "all"]:
        picked = [r for r in rows if category in ("all", r["category"])]
        tokens = sum(r["tokens"] for r in picked)
        off_tps = tokens / sum(r["off_s"] for r in picked)
        on_tps = tokens / sum(r["on_s"] for r in picked)
        by_category[category] = {"prompts": len(picked), "off_tok_s": round(off_tps, 2), "on_tok_s": round(on_tps, 2),
                                 "speedup": round(on_tps / off_tps, 3),
                                 "identical": all(r["same_text"] for r in picked)}
    report["speculation"] = {"max_new_tokens": options.max_new_tokens, "categories": by_category, "prompts": rows}
    return report


def table(report: dict[str, Any]) -> str:
    o = report["overhead"]
    lines = [f"gateway overhead ({o['requests']} one-token requests, loopback, keep-alive):",
             f"  direct engine call p50 {o['direct_ms']['p50']:.2f} ms, over HTTP p50 {o['http_ms']['p50']:.2f} ms, "
             f"overhead p50 {o['overhead_p50_ms']:.2f} ms",
             f"speculation through the API (greedy, {report['speculation']['max_new_tokens']} tokens):",
             f"  {'category':<10} {'prompts':>7} {'off tok/s':>10} {'on tok/s':>10} {'speedup':>8} {'identical':>9}"]
    for name, c in report["speculation"]["categories"].items():
        lines.append(f"  {name:<10} {c['prompts']:>7} {c['off_tok_s']:>10.1f} {c['on_tok_s']:>10.1f} "
                     f"{c['speedup']:>7.2f}x {'yes' if c['identical'] else 'NO':>9}")
    return "\n".join(lines)

"""The local engine's queue on a tiny model: order, no mixing, 429 when full, timeouts, cancellation."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch

from decoding.chat_engine import ChatEngine, ChatRequest, PreparedChat
from decoding.generate import Engine, GenerationConfig
from decoding.loading import LoadedModel
from decoding.structured import OutputPlan
from decoding.tokenizer import Tokenizer
from gateway.local import Done, Job, LocalModel, QueueFullError, RequestTimeoutError
from tests.conftest import TinyFactory, tiny_args, tiny_transformer, word_tokenizer

ENDLESS = 90_000  # tokens: minutes of decoding, so only a cancelled job lets the next one run in time


def long_context_model() -> LoadedModel:
    model = tiny_transformer(tiny_args(16, max_seq_len=ENDLESS + 16), 0, torch.float32, 3.0)
    return LoadedModel("tiny", "tiny-long", model, word_tokenizer(16))


def prepared(engine: Engine, prompt: list[int], tokens: int) -> PreparedChat:
    config = GenerationConfig(max_new_tokens=tokens, ignore_eos=True, speculative=False)
    return PreparedChat(prompt, config, OutputPlan(None), engine)


async def collect(local: LocalModel, job: object) -> tuple[str, Done]:
    text = ""
    async for item in local.events(job, heartbeat_s=0.05):  # type: ignore[arg-type]
        if isinstance(item, str):
            text += item
        elif isinstance(item, Done):
            return text, item
    raise AssertionError("no Done")


def test_concurrent_jobs_each_get_their_own_text(tiny_model: TinyFactory) -> None:
    target = tiny_model(vocab_size=16, dtype=torch.float32)
    engine = Engine(target)
    prompts = [[0, 3 + i, 5 + i % 3] for i in range(8)]
    alone = [engine.complete(p, prepared(engine, p, 12).config).text for p in prompts]
    local = LocalModel("tiny", ChatEngine(engine), max_queue=8, timeout_s=60)

    async def main() -> list[str]:
        jobs = [local.submit(prepared(engine, p, 12)) for p in prompts]
        results = await asyncio.gather(*(collect(local, j) for j in jobs))
        for text, done in results:
            assert text == done.result.text  # the deltas add up to the final text
        return [text for text, _ in results]

    assert asyncio.run(main()) == alone
    local.close()


def test_each_finished_request_logs_one_line_at_info(tiny_model: TinyFactory,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """What `draftgate -v serve` shows per request: tokens, finish reason, times, passes and drafts."""
    target = tiny_model(vocab_size=16, dtype=torch.float32)
    engine = Engine(target)
    local = LocalModel("tiny", ChatEngine(engine), max_queue=2, timeout_s=60)

    async def main() -> Done:
        return (await collect(local, local.submit(prepared(engine, [0, 3, 5], 7))))[1]

    with caplog.at_level(logging.INFO, logger="gateway.local"):
        done = asyncio.run(main())
    local.close()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "gateway.local"]
    assert line.startswith("tiny: 3 prompt (0 cached) + 7 completion tokens, length, queued ")
    assert f"{done.result.stats.target_passes} target passes, 0 of 0 drafts accepted" in line


def test_a_full_queue_is_refused_with_a_retry_time(tiny_model: TinyFactory) -> None:
    target = tiny_model(vocab_size=16, dtype=torch.float32)
    engine = Engine(target)
    local = LocalModel("tiny", ChatEngine(engine), max_queue=2, timeout_s=60)

    async def main() -> QueueFullError:
        jobs = []
        with pytest.raises(QueueFullError) as info:
            for _ in range(50):  # one runs, two wait: the queue fills long before 50
                jobs.append(local.submit(prepared(engine, [0, 3], 200)))
        for job in jobs:
            job.cancelled.set()
        return info.value

    error = asyncio.run(main())
    assert error.retry_after_s >= 1 and "queue is full" in str(error)
    local.close()


def test_a_request_past_its_timeout_is_cancelled_and_the_worker_moves_on() -> None:
    engine = Engine(long_context_model())
    local = LocalModel("tiny", ChatEngine(engine), max_queue=4, timeout_s=0.5)

    async def main() -> int:
        slow = local.submit(prepared(engine, [0, 3], ENDLESS))
        with pytest.raises(RequestTimeoutError):
            await collect(local, slow)
        _, done = await collect(local, local.submit(prepared(engine, [0, 4], 5)))  # within its own 0.5 s
        return done.result.completion_tokens

    assert asyncio.run(main()) == 5
    local.close()


async def decoding_endlessly(local: LocalModel, engine: Engine) -> tuple[Job, AsyncIterator[str | Done | None]]:
    """A job of minutes of decoding, once its first text is out (the worker is on it), and its events."""
    job = local.submit(prepared(engine, [0, 3], ENDLESS))
    events = local.events(job, heartbeat_s=0.05)
    async for item in events:
        if isinstance(item, str):
            break
    return job, events


def test_a_listener_that_leaves_cancels_its_generation() -> None:
    engine = Engine(long_context_model())
    local = LocalModel("tiny", ChatEngine(engine), max_queue=4, timeout_s=20)

    async def main() -> int:
        job, events = await decoding_endlessly(local, engine)
        await events.aclose()  # what a disconnected client's stream does
        assert job.cancelled.is_set()
        _, done = await collect(local, local.submit(prepared(engine, [0, 4], 5)))  # times out unless cancelled
        return done.result.completion_tokens

    assert asyncio.run(main()) == 5
    local.close()


def test_a_request_that_leaves_while_queued_frees_its_slot_at_once() -> None:
    """The slot was held until the worker reached the gone request: 429s for a queue with room (a review)."""
    engine = Engine(long_context_model())
    local = LocalModel("tiny", ChatEngine(engine), max_queue=1, timeout_s=20)

    async def main() -> int:
        _, events = await decoding_endlessly(local, engine)  # the worker has it: the one slot is free again
        waiting = local.submit(prepared(engine, [0, 4], 5))
        with pytest.raises(QueueFullError):
            local.submit(prepared(engine, [0, 5], 5))
        assert local.queued == 1
        waiting.cancelled.set()  # its client left (events() does this when its caller stops)
        assert local.queued == 0
        third = local.submit(prepared(engine, [0, 5], 5))
        await events.aclose()  # the endless one goes too, and the third runs
        _, done = await collect(local, third)
        return done.result.completion_tokens

    assert asyncio.run(main()) == 5
    local.close()


class GatedChat(ChatEngine):
    """A chat engine whose preparation waits for a gate: a schema compile that takes a while."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.gate = threading.Event()

    def prepare(self, request: ChatRequest) -> PreparedChat:
        self.gate.wait(20)
        return super().prepare(request)


def test_a_request_holds_its_slot_while_it_is_prepared(embedded_tokenizer: Tokenizer) -> None:
    """Requests waiting on a preparation counted against no bound: any number could pile up (a review)."""
    model = tiny_transformer(tiny_args(embedded_tokenizer.vocab_size, n_layers=1), 0, torch.float32, 3.0)
    engine = Engine(LoadedModel("tiny", "tiny-chat", model, embedded_tokenizer))
    chat = GatedChat(engine)
    local = LocalModel("tiny", chat, max_queue=2, timeout_s=30)
    request = ChatRequest([{"role": "user", "content": "a b"}], GenerationConfig(max_new_tokens=3, speculative=False))

    async def main() -> list[int]:
        first = [asyncio.create_task(local.admit(request)) for _ in range(2)]
        await asyncio.sleep(0.2)
        assert local.queued == 2  # both preparing
        with pytest.raises(QueueFullError):
            await local.admit(request)
        chat.gate.set()
        jobs = await asyncio.gather(*first)
        return [(await collect(local, job))[1].result.completion_tokens for job in jobs]

    assert asyncio.run(main()) == [3, 3]
    local.close()


@pytest.mark.slow
def test_a_program_that_closes_a_local_model_and_returns_exits_cleanly() -> None:
    # the worker, left to leave on its own, freed the engine while the interpreter shut down: torch's tensor
    # deallocation took the GIL back there and the thread was ended inside C++ (std::terminate, exit 134)
    program = ("from gateway.local import LocalModel\n"
               "from decoding.build import build_engine\n"
               "from decoding.chat_engine import ChatEngine\n"
               "LocalModel('m', ChatEngine(build_engine('embedded', ())), 2, 10).close()\n")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0 and "terminate called" not in proc.stderr, proc.stderr

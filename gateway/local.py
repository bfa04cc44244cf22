"""A local route's engine behind a bounded queue, served by one worker thread.

The engine decodes one request at a time (the model is in this process). Requests are prepared
(rendered, constrained, checked: every 400 happens here) on a thread of their own, then queued; the
worker runs them in order and hands text deltas back to the request's event loop. A request holds a
slot of the queue from its arrival, its preparation (a schema compile, up to a minute) included, until
the worker takes it or it is cancelled; with every slot held, the next is refused at once (429 with
Retry-After). A request past its deadline (counted from its arrival), or whose client went away, is
cancelled between two decode steps, or leaves the queue, and the worker moves on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from decoding.chat_engine import ChatEngine, ChatRequest, PreparedChat
from decoding.generate import GenerationResult
from decoding.structured import ChatOutput
from gateway.errors import to_api_error

log = logging.getLogger(__name__)


class QueueFullError(Exception):
    """Every slot of a route's queue is taken."""

    code = "queue_full"

    def __init__(self, model: str, retry_after_s: int) -> None:
        super().__init__(f"the local engine for {model!r} is busy: its queue is full; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s
        self.param = None


class RequestTimeoutError(Exception):
    """A request that did not finish within the route's request timeout (queue wait included)."""

    code = "request_timeout"

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the request did not complete within {timeout_s:g} s")
        self.param = None


@dataclass
class Done:
    output: ChatOutput
    result: GenerationResult
    queued_s: float


@dataclass
class Job:
    prepared: PreparedChat
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[str | Done | BaseException] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.perf_counter)

    def emit(self, item: str | Done | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, item)


# threads that prepare a route's requests: their own, so that requests waiting on schema compiles (a
# child process each, up to a minute) never hold the threads everything else runs on; a plain request's
# preparation (a chat template) takes milliseconds
PREPARE_THREADS = 16


class LocalModel:
    """One route's `ChatEngine`, its queue and its worker."""

    def __init__(self, name: str, chat: ChatEngine, max_queue: int, timeout_s: float) -> None:
        self.name = name
        self.chat = chat
        self.timeout_s = timeout_s
        self.max_queue = max_queue
        self._lock = threading.Condition()
        self._preparing = 0  # requests holding a slot while they are prepared
        self._waiting: deque[Job] = deque()  # prepared, for the worker (cancelled ones leave when seen)
        self._closed = False
        self._recent_s = 5.0  # a running estimate of one request's service time, for Retry-After
        self._worker = threading.Thread(target=self._work, name=f"engine-{name}", daemon=True)
        self._worker.start()
        self._preparers = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix=f"prepare-{name}")

    @property
    def queued(self) -> int:
        """Requests holding a slot: being prepared, or waiting for the worker."""
        with self._lock:
            self._drop_cancelled()
            return self._preparing + len(self._waiting)

    async def admit(self, request: ChatRequest) -> Job:
        """Take a slot (or refuse, 429), prepare the request on it (its 400s come from here), queue it."""
        arrived = time.perf_counter()
        self._reserve()
        try:
            prepared = await asyncio.get_running_loop().run_in_executor(self._preparers, self.chat.prepare, request)
        except BaseException:
            with self._lock:
                self._preparing -= 1
            raise
        return self._enqueue(prepared, arrived)

    def submit(self, prepared: PreparedChat) -> Job:
        """Queue a request prepared already (or refuse it, 429)."""
        self._reserve()
        return self._enqueue(prepared, time.perf_counter())

    def _reserve(self) -> None:
        with self._lock:
            self._drop_cancelled()
            if self._preparing + len(self._waiting) >= self.max_queue:
                raise QueueFullError(self.name, max(1, round(self._recent_s * self.max_queue / 2)))
            self._preparing += 1

    def _enqueue(self, prepared: PreparedChat, arrived: float) -> Job:
        job = Job(prepared, asyncio.get_running_loop(), enqueued_at=arrived)
        with self._lock:
            self._preparing -= 1
            self._waiting.append(job)
            self._lock.notify()
        return job

    def _drop_cancelled(self) -> None:  # (holding the lock) a request gone while waiting frees its slot
        if any(job.cancelled.is_set() for job in self._waiting):
            self._waiting = deque(job for job in self._waiting if not job.cancelled.is_set())

    async def events(self, job: Job, heartbeat_s: float = 1.0) -> AsyncIterator[str | Done | None]:
        """The job's text deltas, then its `Done`; None after each `heartbeat_s` without news (while
        queued, say), so the caller can check on its client. Cancels the job if the caller stops."""
        deadline = job.enqueued_at + self.timeout_s
        try:
            while True:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    raise RequestTimeoutError(self.timeout_s)
                try:
                    item = await asyncio.wait_for(job.events.get(), min(remaining, heartbeat_s))
                except TimeoutError:
                    yield None
                    continue
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, Done):
                    return
        finally:
            job.cancelled.set()  # a no-op once done; otherwise the worker stops at its next step

    def close(self, timeout_s: float = 2.0) -> None:
        """Take no more requests: waiting ones are cancelled, and the worker leaves once the one it runs (if
        any) ends, waited for up to `timeout_s`. An idle worker is gone when this returns: left to leave on
        its own, it could free the engine while the interpreter shuts down, where torch's tensor
        deallocation, taking the GIL back, ends the thread inside C++ (std::terminate: a program that
        closed a LocalModel and returned aborted with exit code 134)."""
        with self._lock:
            self._closed = True
            for job in self._waiting:
                job.cancelled.set()
            self._waiting.clear()
            self._lock.notify_all()
        self._preparers.shutdown(wait=False, cancel_futures=True)
        if threading.current_thread() is not self._worker:
            self._worker.join(timeout_s)

    def _next(self) -> Job | None:
        with self._lock:
            while not self._closed:
                while self._waiting:
                    job = self._waiting.popleft()
                    if not job.cancelled.is_set():
                        return job
                self._lock.wait()
            return None

    def _work(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            started = time.perf_counter()
            try:
                self._run(job, started)
            except Exception as exc:  # the request's error, delivered to it; the worker lives on
                if to_api_error(exc).code == "internal_error":
                    log.exception("local generation failed")
                else:  # an outcome the client is told of (an output failing its schema): no traceback
                    log.info("local generation ended in %s: %s", type(exc).__name__, exc)
                job.emit(exc)
            self._recent_s = 0.8 * self._recent_s + 0.2 * (time.perf_counter() - started)

    def _run(self, job: Job, started: float) -> None:
        generation = job.prepared.start()
        try:
            for delta in generation:
                if job.cancelled.is_set():
                    return
                job.emit(delta)
        finally:
            generation.close()
        result = generation.result
        if job.cancelled.is_set():
            log.info("%s: cancelled after %d tokens (the client left or timed out)", self.name,
                     result.completion_tokens)
            return
        done = Done(job.prepared.finish(result), result, started - job.enqueued_at)
        s = result.stats
        log.info("%s: %d prompt (%d cached) + %d completion tokens, %s, queued %.2f s, first token %.2f s, "
                 "%.2f s in all, %d target passes, %d of %d drafts accepted", self.name, result.prompt_tokens,
                 s.cached_prompt_tokens, result.completion_tokens, done.output.finish_reason, done.queued_s,
                 result.prefill_s, result.prefill_s + result.decode_s, s.target_passes, s.accepted_tokens,
                 s.draft_tokens)
        job.emit(done)

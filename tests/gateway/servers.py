"""Real `draftgate serve` processes on loopback for the client tests: started, awaited, stopped."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(policy: Path, env: dict[str, str] | None = None, timeout_s: float = 180) -> Iterator[str]:
    """A `draftgate serve --policy policy` process; yields its base URL (ending in /v1)."""
    port = free_port()
    log = policy.with_suffix(".log")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--policy", str(policy), "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"draftgate serve exited ({proc.returncode}):\n{log.read_text()}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"draftgate serve did not come up in {timeout_s} s:\n{log.read_text()}")
            time.sleep(0.5)
        yield f"{base}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()

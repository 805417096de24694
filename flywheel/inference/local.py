"""The local backend: `python -m finetune.serve` (transformers + peft) as a child process,
spoken to as any OpenAI-compatible upstream.

`LocalServer` starts the command, waits for its one ready line on stdout
(`flywheel-serve listening on http://HOST:PORT`) and stops it (SIGTERM, then SIGKILL) on
`stop()`; `LocalBackend` is a `ChatBackend` that starts one and delegates to `OpenAIUpstream`.
`flywheel gateway --backend local` starts one `LocalServer` in the parent process, so several
gateway workers share one model in memory.
"""

from __future__ import annotations

import asyncio
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing, suppress
from pathlib import Path
from typing import IO, Any

from flywheel.children import die_with_parent
from flywheel.errors import InvalidState
from flywheel.inference.backends import Adapter
from flywheel.inference.upstream import OpenAIUpstream

READY = re.compile(r"flywheel-serve listening on (http://\S+)")
TAIL_LINES = 20


def serve_command(base_model: str | Path) -> list[str]:
    """The local server's command line (the contract of `python -m finetune.serve`)."""
    return [
        sys.executable,
        "-m",
        "finetune.serve",
        "--base-model",
        str(base_model),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]


class LocalServer:
    """One child server process: started, ready, stopped."""

    def __init__(self, command: Sequence[str], *, ready_timeout_s: float = 300) -> None:
        self.command = list(command)
        self.ready_timeout_s = ready_timeout_s
        self.process: subprocess.Popen[str] | None = None
        self.url: str | None = None
        self._drain: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT/v1`, as the openai client and `OpenAIUpstream` take it."""
        if self.url is None:
            raise InvalidState("the local server is not started")
        return self.url.rstrip("/") + "/v1"

    def start(self) -> str:
        """Start the server and wait for its ready line; its base URL. InvalidState (with the
        end of its output) when it exits or stays silent past `ready_timeout_s`."""
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: stopped with every child it has
            preexec_fn=die_with_parent(),  # one prctl call in the child: no locks, no imports
        )
        assert self.process.stdout is not None
        self.url = self._wait_ready(self.process, self.process.stdout)
        return self.base_url

    def _wait_ready(self, process: subprocess.Popen[str], stdout: IO[str]) -> str:
        deadline = time.monotonic() + self.ready_timeout_s
        tail: list[str] = []
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if not selector.select(timeout=min(left, 1.0)):
                    continue
                line = stdout.readline()
                if not line:  # EOF: it exited
                    break
                found = READY.search(line)
                if found:
                    self._drain = _drain(stdout)
                    return found.group(1)
                tail = [*tail, line.rstrip()][-TAIL_LINES:]
        self.stop()
        said = " | ".join(tail) or "nothing"
        raise InvalidState(f"the local server {' '.join(self.command[:4])} did not start: {said}")

    def stop(self, *, grace_s: float = 10) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        drain, self._drain = self._drain, None
        if drain is not None:
            drain.join(timeout=5)
        if process.stdout is not None:
            process.stdout.close()


def _drain(stdout: IO[str]) -> threading.Thread:
    """Keep reading what the server prints (to this process's stderr): a pipe nobody reads
    fills up and blocks the server's next write."""

    def forward() -> None:
        for line in stdout:
            sys.stderr.write(line)

    thread = threading.Thread(target=forward, name="local-server-output", daemon=True)
    thread.start()
    return thread


def _signal_group(process: subprocess.Popen[str], signum: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


class LocalBackend:
    """A `ChatBackend` on a `LocalServer` it starts (`start()`) and stops (`aclose()`)."""

    def __init__(self, command: Sequence[str], *, base_model: str, **upstream_options: Any) -> None:
        self.server = LocalServer(command)
        self._base_model = base_model
        self._options = upstream_options
        self._upstream: OpenAIUpstream | None = None

    async def start(self) -> None:
        url = await asyncio.to_thread(self.server.start)
        self._upstream = OpenAIUpstream(url, base_model=self._base_model, **self._options)

    @property
    def upstream(self) -> OpenAIUpstream:
        if self._upstream is None:
            raise InvalidState("the local backend is not started")
        return self._upstream

    @property
    def base_model(self) -> str:
        return self._base_model

    async def ensure_adapter(self, adapter: Adapter) -> None:
        await self.upstream.ensure_adapter(adapter)

    async def complete(self, body: dict[str, Any], adapter: Adapter | None) -> dict[str, Any]:
        return await self.upstream.complete(body, adapter)

    async def stream(
        self, body: dict[str, Any], adapter: Adapter | None
    ) -> AsyncIterator[dict[str, Any]]:
        async with aclosing(self.upstream.stream(body, adapter)) as chunks:  # type: ignore[type-var]
            async for chunk in chunks:
                yield chunk

    async def aclose(self) -> None:
        if self._upstream is not None:
            await self._upstream.aclose()
            self._upstream = None
        await asyncio.to_thread(self.server.stop)

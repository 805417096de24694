"""The local backend's process handling, with the stand-in server as the child (it prints the
same ready line `python -m finetune.serve` prints): started, spoken to, stopped."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from flywheel.errors import InvalidState
from flywheel.inference.backends import Adapter
from flywheel.inference.local import LocalBackend, LocalServer, serve_command

pytestmark = pytest.mark.no_database

STANDIN = [sys.executable, "-m", "flywheel.inference.standin", "--port", "0"]


def test_the_local_backend_starts_serves_and_stops_its_server(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text("{}")

    async def scenario() -> tuple[str, str, int | None]:
        backend = LocalBackend([*STANDIN, "--base-model", "tiny"], base_model="tiny")
        await backend.start()
        process = backend.server.process
        assert process is not None
        assert process.poll() is None
        try:
            await backend.ensure_adapter(Adapter("acme.billing-v1", tmp_path))
            body = {"messages": [{"role": "user", "content": "hi"}]}
            answer = await backend.complete(body, Adapter("acme.billing-v1", tmp_path))
            chunks = [chunk async for chunk in backend.stream(body, None)]
        finally:
            await backend.aclose()
        text = "".join(
            (choice.get("delta") or {}).get("content") or ""
            for chunk in chunks
            for choice in chunk.get("choices") or ()
        )
        return answer["choices"][0]["message"]["content"], text, process.poll()

    content, streamed, code = asyncio.run(scenario())
    assert content == "reply from acme.billing-v1 to: hi"
    assert streamed == "reply from tiny to: hi"
    assert code is not None  # stopped by aclose(), not left running


def test_a_server_that_exits_before_ready_is_a_clear_error() -> None:
    server = LocalServer([sys.executable, "-c", "print('loading'); print('no GPU here')"])
    with pytest.raises(InvalidState, match=re.escape("did not start: loading | no GPU here")):
        server.start()
    assert server.process is None


def test_a_silent_server_is_stopped_after_the_ready_timeout() -> None:
    server = LocalServer([sys.executable, "-c", "import time; time.sleep(60)"], ready_timeout_s=1)
    with pytest.raises(InvalidState, match="did not start: nothing"):
        server.start()
    assert server.process is None


def test_the_serve_command_is_the_contracts() -> None:
    command = serve_command("/models/tiny")
    assert command[1:] == [
        "-m", "finetune.serve", "--base-model", "/models/tiny", "--host", "127.0.0.1",
        "--port", "0",
    ]  # fmt: skip


def test_the_server_dies_with_the_process_that_started_it() -> None:
    """A gateway killed outright (SIGKILL: no `stop`, no `finally`) leaves no local server."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, *STANDIN, "--base-model", "tiny"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert psutil.pid_exists(child)

    parent.kill()
    parent.wait()
    parent.stdout.close()

    assert _gone(child, within_s=20), f"the local server {child} outlived its gateway"


PARENT = """
import sys, time
from flywheel.inference.local import LocalServer
server = LocalServer(sys.argv[1:])
server.start()
print(server.process.pid, flush=True)
time.sleep(600)
"""


def _gone(pid: int, *, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False

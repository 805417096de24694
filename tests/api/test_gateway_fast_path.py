"""`POST /v1/chat/completions` is served from the middleware stack (`api.gateway.ChatFastPath`)
and its streams watch for a disconnect with one task (`ClosingStreamingResponse`): what
FastAPI's route and Starlette's streaming response did for it must still hold."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from flywheel.inference.standin import RunningStandin
from flywheel.settings import Settings
from tests.api.test_gateway import (  # the fixtures, reused
    Served,
    ask,
    caller,  # noqa: F401 (a fixture)
    gateway,  # noqa: F401 (a fixture)
    rows,
    serve_gateway,
    standin,  # noqa: F401 (a fixture)
)
from tests.conftest import Caller

pytestmark = pytest.mark.commits("the gateway serves from a thread; its recorder commits")

MAX_BODY_BYTES = 4096


@pytest.fixture
def capped(
    standin: RunningStandin,  # noqa: F811 (the fixture above)
    committing_engine: Engine,
    session_settings: Settings,
    tmp_path: Path,
) -> Iterator[Served]:
    with serve_gateway(
        standin, committing_engine, session_settings, tmp_path, max_body_bytes=MAX_BODY_BYTES
    ) as served:
        yield served


def test_a_chunked_body_past_the_cap_is_413_in_openai_shape_and_reaches_no_upstream(
    capped: Served,
    caller: Caller,  # noqa: F811 (the fixture above)
) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap cuts it off as it comes
        yield b'{"model": "billing", "messages": [{"role": "user", "content": "'
        for _ in range(MAX_BODY_BYTES // 512 + 1):
            yield b"x" * 512
        yield b'"}]}'

    response = httpx.post(
        f"{capped.base_url}/chat/completions",
        content=chunks(),
        headers={"authorization": f"Bearer {caller.key}", "content-type": "application/json"},
    )
    assert response.status_code == 413
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert str(MAX_BODY_BYTES) in error["message"]
    assert capped.chats() == []


def test_other_methods_on_the_chat_path_are_405_in_openai_shape(
    gateway: Served,  # noqa: F811 (the fixture above)
    caller: Caller,  # noqa: F811 (the fixture above)
) -> None:
    response = httpx.get(
        f"{gateway.base_url}/chat/completions", headers={"authorization": f"Bearer {caller.key}"}
    )
    assert response.status_code == 405
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_a_stream_abandoned_while_the_upstream_is_silent_is_closed_at_once(
    gateway: Served,  # noqa: F811 (the fixture above)
    sessions: sessionmaker[Session],
    caller: Caller,  # noqa: F811 (the fixture above)
) -> None:
    """The disconnect is seen while the gateway waits for the upstream's next chunk (30 s
    away), not when that chunk would have been sent: the upstream stream is closed, the call
    recorded as abandoned, within seconds."""
    body = {
        "model": "billing",
        "messages": ask("slow one two three [standin:chunk-delay-ms=30000]"),
        "stream": True,
    }
    headers = {"authorization": f"Bearer {caller.key}"}
    with (
        httpx.Client(timeout=20) as client,
        client.stream(
            "POST", f"{gateway.base_url}/chat/completions", json=body, headers=headers
        ) as response,
    ):
        assert response.status_code == 200
        next(response.iter_raw())  # the first chunk is in; the next is 30 s away
    deadline = time.monotonic() + 10
    while not gateway.chats()[0].get("disconnected") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gateway.chats()[0]["disconnected"] is True
    deadline = time.monotonic() + 10
    while not (recorded := rows(gateway, sessions)) and time.monotonic() < deadline:
        time.sleep(0.05)
    (row,) = recorded
    assert (row.status, row.error) == ("failed", "client disconnected")

"""`OpenAIUpstream` against the stand-in OpenAI-compatible server, over real HTTP on loopback.

The stand-in (flywheel/inference/standin.py) speaks the subset of vLLM's protocol the gateway
uses and records every request it receives, so each test reads what the upstream really got.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest

from flywheel.inference.backends import Adapter, BackendError
from flywheel.inference.standin import RunningStandin, StandinConfig, serve_in_thread
from flywheel.inference.upstream import OpenAIUpstream

pytestmark = pytest.mark.no_database

T = TypeVar("T")
BASE = "standin-base"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


@pytest.fixture(scope="module")
def standin() -> Iterator[RunningStandin]:
    with serve_in_thread(StandinConfig(base_model=BASE, chunks=4)) as running:
        yield running


@pytest.fixture
def server(standin: RunningStandin) -> RunningStandin:
    standin.app.requests.clear()
    standin.app.adapters.clear()
    return standin


@pytest.fixture
def adapter_dir(tmp_path: Path) -> Path:
    (tmp_path / "adapter_config.json").write_text("{}")
    return tmp_path


def chats(server: RunningStandin) -> list[dict[str, Any]]:
    return [r for r in server.app.requests if r["path"] == "/v1/chat/completions"]


def paths(server: RunningStandin) -> list[tuple[str, str]]:
    return [(r["method"], r["path"]) for r in server.app.requests]


async def with_upstream(server: RunningStandin, **options: Any) -> OpenAIUpstream:
    return OpenAIUpstream(server.base_url, base_model=BASE, **options)


async def collect(chunks: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [chunk async for chunk in chunks]


def text_of(chunks: list[dict[str, Any]]) -> str:
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    return "".join(d.get("content") or "" for d in deltas)


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# Answers.
def test_complete_sends_the_base_model_or_the_adapter_and_returns_the_completion(
    server: RunningStandin, adapter_dir: Path
) -> None:
    adapter = Adapter("acme.billing-v3", adapter_dir)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        upstream = await with_upstream(server)
        base = await upstream.complete({**user("hello there"), "model": "ignored"}, None)
        await upstream.ensure_adapter(adapter)
        tuned = await upstream.complete({**user("hello there"), "temperature": 0}, adapter)
        await upstream.aclose()
        return base, tuned

    base, tuned = run(scenario())
    assert base["object"] == "chat.completion"
    assert base["choices"][0]["message"] == {
        "role": "assistant",
        "content": "reply from standin-base to: hello there",
    }
    assert base["choices"][0]["finish_reason"] == "stop"
    assert base["usage"] == {"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8}
    assert tuned["choices"][0]["message"]["content"] == "reply from acme.billing-v3 to: hello there"
    sent = [r["body"] for r in chats(server)]
    assert [b["model"] for b in sent] == [BASE, "acme.billing-v3"]
    assert sent[1]["temperature"] == 0
    assert "stream" not in sent[0]


def test_stream_yields_chunks_that_make_up_the_whole_answer(server: RunningStandin) -> None:
    body = {**user("tell me a story"), "stream_options": {"include_usage": True}}

    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        upstream = await with_upstream(server)
        chunks = await collect(upstream.stream(body, None))
        whole = await upstream.complete(user("tell me a story"), None)
        await upstream.aclose()
        return chunks, whole

    chunks, whole = run(scenario())
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len(chunks) == 1 + 4 + 1 + 1  # role, four content pieces, finish, usage
    assert text_of(chunks) == whole["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == whole["usage"]
    streamed = chats(server)[0]["body"]
    assert streamed["stream"] is True
    assert streamed["stream_options"] == {"include_usage": True}
    assert streamed["model"] == BASE


def test_tools_reach_the_upstream_and_its_tool_calls_come_back(server: RunningStandin) -> None:
    ask = {
        "messages": [{"role": "user", "content": "please call get_weather for Paris"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
    }

    async def scenario() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        upstream = await with_upstream(server)
        answer = await upstream.complete(ask, None)
        chunks = await collect(upstream.stream(ask, None))
        call = answer["choices"][0]["message"]["tool_calls"][0]
        result = {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 C"}
        follow_up = {
            **ask,
            "messages": [*ask["messages"], answer["choices"][0]["message"], result],
        }
        final = await upstream.complete(follow_up, None)
        await upstream.aclose()
        return answer, chunks, final

    answer, chunks, final = run(scenario())
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert call["function"]["arguments"] == (
        '{"city":"please call get_weather for Paris","days":1}'
    )
    streamed_calls = [
        d["tool_calls"] for c in chunks for d in [c["choices"][0]["delta"]] if "tool_calls" in d
    ]
    assert streamed_calls[0][0]["function"]["name"] == "get_weather"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert final["choices"][0]["message"]["content"] == (
        "reply from standin-base to tool result: sunny, 21 C"
    )
    sent = [r["body"] for r in chats(server)]
    assert all(b["tools"] == [WEATHER_TOOL] and b["tool_choice"] == "auto" for b in sent)
    assert sent[2]["messages"][1]["tool_calls"] == [call]
    assert sent[2]["messages"][2]["tool_call_id"] == call["id"]


def test_the_api_key_is_sent_as_a_bearer_token(server: RunningStandin) -> None:
    async def scenario() -> None:
        upstream = await with_upstream(server, api_key="sk-upstream")
        await upstream.complete(user("hi"), None)
        await upstream.aclose()

    run(scenario())
    assert chats(server)[0]["headers"]["authorization"] == "Bearer sk-upstream"


def test_requests_reuse_kept_alive_connections(server: RunningStandin) -> None:
    async def scenario(max_connections: int) -> None:
        upstream = await with_upstream(server, max_connections=max_connections)
        for _ in range(20):
            await upstream.complete(user("hi"), None)
        await upstream.aclose()

    run(scenario(10))
    run(scenario(100))  # one request at a time: one kept-alive connection, however many allowed
    ports = [r["client_port"] for r in chats(server)]
    assert len(set(ports[:20])) == 1
    assert len(set(ports[20:])) == 1
    assert ports[0] != ports[20]  # each upstream its own connections


def test_a_task_cancelled_mid_stream_closes_the_upstream_request(server: RunningStandin) -> None:
    body = user("a long answer [standin:chunk-delay-ms=200]")

    async def scenario() -> int:
        upstream = await with_upstream(server)
        received: list[dict[str, Any]] = []

        async def consume() -> None:
            async for chunk in upstream.stream(body, None):
                received.append(chunk)

        task = asyncio.ensure_future(consume())
        while len(received) < 2:
            await asyncio.sleep(0.01)
        task.cancel()  # what a server does to a handler whose client went away
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if chats(server)[0]["disconnected"]:
                break
            await asyncio.sleep(0.02)
        await upstream.aclose()
        return len(received)

    assert run(scenario()) == 2
    assert chats(server)[0]["disconnected"] is True


# Adapters.
def test_ten_concurrent_ensures_load_an_adapter_once(
    server: RunningStandin, adapter_dir: Path
) -> None:
    adapter = Adapter("acme.billing-v3", adapter_dir)

    async def scenario() -> None:
        upstream = await with_upstream(server)
        await asyncio.gather(*(upstream.ensure_adapter(adapter) for _ in range(10)))
        await upstream.ensure_adapter(adapter)
        await upstream.aclose()

    run(scenario())
    loads = [r for r in server.app.requests if r["path"] == "/v1/load_lora_adapter"]
    assert len(loads) == 1
    assert loads[0]["body"] == {"lora_name": "acme.billing-v3", "lora_path": str(adapter_dir)}
    assert server.app.adapters == {"acme.billing-v3": str(adapter_dir)}
    listed = httpx.get(f"{server.base_url}/models").json()
    assert [card["id"] for card in listed["data"]] == [BASE, "acme.billing-v3"]


def test_an_adapter_the_upstream_already_loaded_counts_as_loaded(
    server: RunningStandin, adapter_dir: Path
) -> None:
    adapter = Adapter("acme.billing-v3", adapter_dir)
    load = {"lora_name": adapter.name, "lora_path": str(adapter_dir)}
    assert httpx.post(f"{server.base_url}/load_lora_adapter", json=load).status_code == 200
    again = httpx.post(f"{server.base_url}/load_lora_adapter", json=load)
    assert again.status_code == 400
    assert again.json()["error"]["message"] == (
        "The lora adapter 'acme.billing-v3' has already been loaded."
    )

    async def scenario() -> dict[str, Any]:
        upstream = await with_upstream(server)  # a new process: it never loaded it itself
        await upstream.ensure_adapter(adapter)
        answer = await upstream.complete(user("hi"), adapter)
        await upstream.aclose()
        return answer

    assert run(scenario())["model"] == "acme.billing-v3"
    assert paths(server).count(("POST", "/v1/load_lora_adapter")) == 3


def test_an_adapter_the_upstream_cannot_load_is_an_upstream_error(
    server: RunningStandin, tmp_path: Path
) -> None:
    async def scenario() -> None:
        upstream = await with_upstream(server)
        try:
            await upstream.ensure_adapter(Adapter("acme.billing-v4", tmp_path / "missing"))
        finally:
            await upstream.aclose()

    with pytest.raises(BackendError) as caught:
        run(scenario())
    assert caught.value.kind == "upstream_error"
    assert caught.value.upstream_status == 404
    assert "No adapter found" in caught.value.message
    assert caught.value.status == 502


def test_concurrent_ensures_of_an_adapter_that_fails_share_one_attempt(
    server: RunningStandin, tmp_path: Path
) -> None:
    adapter = Adapter("acme.billing-v4", tmp_path / "missing")

    async def scenario() -> list[BaseException | None]:
        upstream = await with_upstream(server)
        tries = [upstream.ensure_adapter(adapter) for _ in range(10)]
        outcomes = await asyncio.gather(*tries, return_exceptions=True)
        again = await asyncio.gather(upstream.ensure_adapter(adapter), return_exceptions=True)
        await upstream.aclose()
        return [*outcomes, *again]

    outcomes = run(scenario())
    assert all(isinstance(o, BackendError) and o.upstream_status == 404 for o in outcomes)
    assert paths(server).count(("POST", "/v1/load_lora_adapter")) == 2  # the ten, then one


def test_without_dynamic_lora_an_adapter_must_be_listed_and_is_looked_up_once(
    server: RunningStandin, adapter_dir: Path
) -> None:
    server.app.adapters["acme.billing-v3"] = str(adapter_dir)  # as `--lora-modules` would

    async def scenario() -> BackendError:
        upstream = await with_upstream(server, dynamic_lora=False)
        listed = Adapter("acme.billing-v3", adapter_dir)
        await asyncio.gather(*(upstream.ensure_adapter(listed) for _ in range(5)))
        await upstream.ensure_adapter(listed)
        try:
            await upstream.ensure_adapter(Adapter("acme.billing-v9", adapter_dir))
        except BackendError as error:
            return error
        finally:
            await upstream.aclose()
        raise AssertionError("an unlisted adapter was accepted")

    error = run(scenario())
    assert error.kind == "upstream_error"
    assert "acme.billing-v9" in error.message
    assert paths(server) == [("GET", "/v1/models")] * 2
    assert server.app.adapters == {"acme.billing-v3": str(adapter_dir)}


def test_an_adapter_the_upstream_lost_is_loaded_again(
    server: RunningStandin, adapter_dir: Path
) -> None:
    adapter = Adapter("acme.billing-v3", adapter_dir)

    async def scenario() -> tuple[BackendError, dict[str, Any]]:
        upstream = await with_upstream(server)
        await upstream.ensure_adapter(adapter)
        server.app.adapters.clear()  # the upstream restarted
        try:
            await upstream.complete(user("hi"), adapter)
        except BackendError as error:
            lost = error
        await upstream.ensure_adapter(adapter)
        answer = await upstream.complete(user("hi"), adapter)
        await upstream.aclose()
        return lost, answer

    lost, answer = run(scenario())
    assert (lost.kind, lost.upstream_status) == ("upstream_error", 404)
    assert answer["model"] == "acme.billing-v3"
    assert paths(server).count(("POST", "/v1/load_lora_adapter")) == 2


# Failures.
def failure(action: Coroutine[Any, Any, Any]) -> BackendError:
    with pytest.raises(BackendError) as caught:
        run(action)
    return caught.value


async def complete_once(base_url: str, body: dict[str, Any], **options: Any) -> None:
    upstream = OpenAIUpstream(base_url, **{"base_model": BASE, **options})
    try:
        await upstream.complete(body, None)
    finally:
        await upstream.aclose()


async def stream_once(
    base_url: str, body: dict[str, Any], received: list[dict[str, Any]], **options: Any
) -> None:
    upstream = OpenAIUpstream(base_url, **{"base_model": BASE, **options})
    try:
        async for chunk in upstream.stream(body, None):
            received.append(chunk)
    finally:
        await upstream.aclose()


def test_an_unreachable_upstream_is_unavailable() -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    for error in (
        failure(complete_once(base_url, user("hi"))),
        failure(stream_once(base_url, user("hi"), [])),
    ):
        assert error.kind == "unavailable"
        assert error.status == 502
        assert "127.0.0.1" not in error.message


def test_an_error_status_is_an_upstream_error_with_the_upstreams_message(
    server: RunningStandin,
) -> None:
    body = user("hi [standin:status=500]")
    for error in (
        failure(complete_once(server.base_url, body)),
        failure(stream_once(server.base_url, body, [])),
    ):
        assert error.kind == "upstream_error"
        assert error.upstream_status == 500
        assert error.message == "the upstream answered 500: stand-in fault: status 500"
    unknown = failure(complete_once(server.base_url, {**user("hi")}, base_model="nope"))
    assert unknown.upstream_status == 404
    assert "The model `nope` does not exist." in unknown.message


def test_a_refused_api_key_is_an_upstream_error() -> None:
    with serve_in_thread(StandinConfig(base_model=BASE, api_key="sk-right")) as guarded:
        refused = failure(complete_once(guarded.base_url, user("hi"), api_key="sk-wrong"))
        run(complete_once(guarded.base_url, user("hi"), api_key="sk-right"))
    assert (refused.kind, refused.upstream_status) == ("upstream_error", 401)
    assert refused.message == "the upstream answered 401: Unauthorized"
    assert "sk-" not in refused.message


def test_an_upstream_that_does_not_answer_in_time_is_a_timeout(server: RunningStandin) -> None:
    hang = user("hi [standin:hang]")
    slow_chunks = user("hi [standin:chunk-delay-ms=10000]")
    received: list[dict[str, Any]] = []
    started = time.monotonic()
    errors = [
        failure(complete_once(server.base_url, hang, timeout_s=0.3)),
        failure(stream_once(server.base_url, hang, [], timeout_s=0.3)),
        failure(stream_once(server.base_url, slow_chunks, received, timeout_s=0.3)),
    ]
    assert time.monotonic() - started < 8  # not the 10 s the second chunk would take
    assert [e.kind for e in errors] == ["timeout"] * 3
    assert {e.status for e in errors} == {504}
    assert len(received) == 1  # the first chunk came; the second never did in time


def test_a_stream_broken_mid_way_is_dropped(server: RunningStandin) -> None:
    received: list[dict[str, Any]] = []
    error = failure(stream_once(server.base_url, user("hi [standin:drop-after=3]"), received))
    assert error.kind == "dropped"
    assert len(received) == 3
    cut = failure(complete_once(server.base_url, user("hi [standin:drop-after=0]")))
    assert cut.kind == "dropped"


def test_closing_a_stream_early_closes_the_upstream_request(server: RunningStandin) -> None:
    body = user("a long answer [standin:chunk-delay-ms=200]")

    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        upstream = await with_upstream(server)
        chunks = upstream.stream(body, None)
        first = [await anext(chunks), await anext(chunks)]
        await chunks.aclose()  # type: ignore[attr-defined]
        for _ in range(100):
            if chats(server)[0]["disconnected"]:
                break
            await asyncio.sleep(0.02)
        after = await upstream.complete(user("still there?"), None)  # the pool still works
        await upstream.aclose()
        return first, after

    first, after = run(scenario())
    assert len(first) == 2
    assert chats(server)[0]["disconnected"] is True
    assert after["choices"][0]["message"]["content"] == "reply from standin-base to: still there?"


# The stand-in itself.
def test_the_standin_unloads_adapters_and_reports_what_it_received(
    server: RunningStandin, adapter_dir: Path
) -> None:
    base = server.base_url
    load = {"lora_name": "a-v1", "lora_path": str(adapter_dir)}
    assert httpx.post(f"{base}/load_lora_adapter", json=load).text == (
        "Success: LoRA adapter 'a-v1' added successfully."
    )
    assert httpx.post(f"{base}/unload_lora_adapter", json={"lora_name": "a-v1"}).status_code == 200
    gone = httpx.post(f"{base}/unload_lora_adapter", json={"lora_name": "a-v1"})
    assert gone.status_code == 404
    assert gone.json()["error"]["type"] == "NotFoundError"
    chat = {**user("hi"), "model": BASE}
    faulty = httpx.post(
        f"{base}/chat/completions", json=chat, headers={"X-Standin-Fault": "status=503"}
    )
    assert faulty.status_code == 503
    assert faulty.json()["error"]["code"] == 503
    assert httpx.get(f"{base}/nowhere").status_code == 404
    assert httpx.get(f"{base}/chat/completions").status_code == 405
    recorded = httpx.get(f"http://127.0.0.1:{server.port}/_standin/requests").json()
    assert [(r["method"], r["path"]) for r in recorded] == [
        ("POST", "/v1/load_lora_adapter"),
        ("POST", "/v1/unload_lora_adapter"),
        ("POST", "/v1/unload_lora_adapter"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/nowhere"),
        ("GET", "/v1/chat/completions"),
    ]
    assert recorded[0]["body"] == load


def test_the_official_openai_client_reads_the_standins_answers(server: RunningStandin) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    ask = [{"role": "user", "content": "please call get_weather now"}]
    called = client.chat.completions.create(model=BASE, messages=ask, tools=[WEATHER_TOOL])
    [call] = called.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    assert called.choices[0].finish_reason == "tool_calls"
    streamed = client.chat.completions.create(
        model=BASE,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "reply from standin-base to: hi"
    )
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 1 + 5
    client.close()


def test_the_standin_command_prints_its_address_once_serving() -> None:
    command = [sys.executable, "-m", "flywheel.inference.standin", "--port", "0", "--chunks", "2"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            assert line.startswith("flywheel-serve listening on http://127.0.0.1:")
            base_url = line.removeprefix("flywheel-serve listening on ") + "/v1"
            body = {**user("hi"), "model": BASE, "stream": True}
            with httpx.stream("POST", f"{base_url}/chat/completions", json=body) as response:
                events = [line for line in response.iter_lines() if line]
            assert len(events) == 1 + 2 + 1 + 1  # role, two pieces, finish, [DONE]
            assert events[-1] == "data: [DONE]"
        finally:
            process.terminate()
            process.wait(timeout=10)

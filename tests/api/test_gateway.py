"""The gateway, served by a real uvicorn on loopback, called with the official `openai` client;
its upstream is the stand-in OpenAI-compatible server over HTTP (it records what it received),
its recorder the real one writing interactions into the test database, versions registered in
a real MLflow store.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.app import create_app
from api.gateway import create_gateway_app
from flywheel.db import make_session_factory, unit_of_work
from flywheel.feedback.models import Interaction
from flywheel.inference.standin import RunningStandin, StandinConfig, serve_in_thread
from flywheel.models import Domain, ModelVersion, Run
from flywheel.registry import service
from flywheel.registry.mlflow_registry import MlflowRegistry
from flywheel.settings import Settings
from tests.conftest import Caller, make_caller
from tests.integration.test_registry import adapter_run

pytestmark = pytest.mark.commits("the gateway serves from a thread; its recorder commits")

BASE = "standin-base"
SCOPES = ("infer", "feedback:write", "data:read")
UPSTREAM_TIMEOUT_S = 1.5
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@dataclass
class Served:
    app: FastAPI
    port: int
    loop: asyncio.AbstractEventLoop
    standin: RunningStandin
    settings: Settings
    clients: list[openai.OpenAI] = field(default_factory=list)  # closed with the gateway

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def client(self, key: str) -> openai.OpenAI:
        client = openai.OpenAI(base_url=self.base_url, api_key=key, max_retries=0, timeout=20)
        self.clients.append(client)  # else its socket may be collected unclosed, any time later
        return client

    def flush(self) -> None:
        recorder = self.app.state.gateway.recorder
        asyncio.run_coroutine_threadsafe(recorder.flush(), self.loop).result(timeout=30)

    def chats(self) -> list[dict[str, Any]]:
        app = self.standin.app
        return [r for r in list(app.requests) if r["path"] == "/v1/chat/completions"]

    def loads(self) -> list[dict[str, Any]]:
        app = self.standin.app
        return [r["body"] for r in list(app.requests) if r["path"] == "/v1/load_lora_adapter"]


@pytest.fixture(scope="module")
def standin() -> Iterator[RunningStandin]:
    with serve_in_thread(StandinConfig(base_model=BASE, chunks=4)) as running:
        yield running


@pytest.fixture
def gateway(
    standin: RunningStandin,
    committing_engine: Engine,
    session_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """A gateway of its own per test (its home, MLflow store, caches), on the shared stand-in."""
    home = tmp_path_factory.mktemp("gateway-home")
    with serve_gateway(standin, committing_engine, session_settings, home) as served:
        yield served


@contextmanager
def serve_gateway(
    standin: RunningStandin, engine: Engine, base: Settings, home: Path, **overrides: Any
) -> Iterator[Served]:
    standin.app.requests.clear()
    standin.app.adapters.clear()
    settings = base.model_copy(
        update={
            "home": home,
            "mlflow_tracking_uri": f"sqlite:///{home / 'mlflow.db'}",
            "gateway_upstream_url": standin.base_url,
            "gateway_base_model": BASE,
            "gateway_upstream_timeout_s": UPSTREAM_TIMEOUT_S,
            "gateway_route_cache_ttl_s": 0.0,  # tests promote and expect the next call to see it
            **overrides,
        }
    )
    app = create_gateway_app(settings, sessions=make_session_factory(engine))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(server.serve(sockets=[sock]),), daemon=True
    )
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the gateway did not start"
        time.sleep(0.01)
    served = Served(app, sock.getsockname()[1], loop, standin, settings)
    try:
        yield served
    finally:
        for client in served.clients:
            client.close()
        server.should_exit = True
        thread.join(timeout=20)
        loop.close()
        sock.close()


@pytest.fixture
def caller(sessions: sessionmaker[Session]) -> Caller:
    return make_caller(sessions, scopes=SCOPES)


def ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def rows(gateway: Served, sessions: sessionmaker[Session]) -> list[Interaction]:
    gateway.flush()
    with sessions() as session:
        found = session.scalars(select(Interaction).order_by(Interaction.created_at))
        return list(found)


def register(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller, tmp_path: Path, marker: str
) -> ModelVersion:
    """A version of acme.billing in the real MLflow store, gated (a challenger candidate)."""
    registry = MlflowRegistry(gateway.settings.resolved_mlflow_tracking_uri)
    run_id = adapter_run(registry.tracking_uri, tmp_path, marker)
    with unit_of_work(sessions) as session:
        domain = domain_of(session, caller)
        run = Run(
            tenant_id=caller.tenant_id,
            domain_id=domain.id,
            method="sft",
            config_sha256="0" * 64,
            mlflow_run_id=run_id,
            status="succeeded",
        )
        session.add(run)
        session.flush()
        version = service.register_version(
            session=session,
            registry=registry,
            run=run,
            adapter_uri=f"runs:/{run_id}/adapter",
            base_model="/models/tiny",
        )
        version.gate_result = {"is_promoted": True, "reasons": []}
        return version


def promote(gateway: Served, sessions: sessionmaker[Session], caller: Caller, version: str) -> None:
    registry = MlflowRegistry(gateway.settings.resolved_mlflow_tracking_uri)
    with unit_of_work(sessions) as session:
        service.promote(
            session=session,
            registry=registry,
            domain=domain_of(session, caller),
            version=version,
            actor="test",
            force=True,
        )


def domain_of(session: Session, caller: Caller) -> Domain:
    return session.scalars(select(Domain).where(Domain.tenant_id == caller.tenant_id)).one()


def set_release(sessions: sessionmaker[Session], caller: Caller, **release: Any) -> None:
    with unit_of_work(sessions) as session:
        session.execute(
            update(Domain)
            .where(Domain.tenant_id == caller.tenant_id)
            .values(config={"release": release})
        )


def error_of(raised: openai.APIStatusError) -> dict[str, Any]:
    body = raised.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


# Routing.


def test_the_base_model_answers_before_a_champion_and_every_call_is_recorded(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller
) -> None:
    raw = gateway.client(caller.key).chat.completions.with_raw_response.create(
        model="billing", messages=ask("hello there"), user="u-1"
    )
    answer = raw.parse()
    assert answer.model == "billing"
    assert answer.choices[0].message.content == f"reply from {BASE} to: hello there"
    meta = answer.model_extra["flywheel"]  # type: ignore[index]
    assert meta["domain"] == "billing"
    assert (meta["version"], meta["role"]) == ("base", "base")
    assert raw.headers["x-flywheel-interaction-id"] == meta["interaction_id"]
    assert [chat["body"]["model"] for chat in gateway.chats()] == [BASE]

    (row,) = rows(gateway, sessions)
    assert str(row.id) == meta["interaction_id"]
    assert (row.model_name, row.model_version, row.adapter) == (None, None, None)
    assert (row.release_role, row.status, row.end_user) == ("base", "ok", "u-1")
    assert row.response == answer.choices[0].message.content
    assert row.prompt_tokens == answer.usage.prompt_tokens  # type: ignore[union-attr]
    assert row.completion_tokens == answer.usage.completion_tokens  # type: ignore[union-attr]
    assert row.latency_ms is not None
    assert row.latency_ms > 0
    assert row.finish_reason == "stop"


def test_the_champion_answers_with_its_adapter_downloaded_and_loaded_once(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller, tmp_path: Path
) -> None:
    register(gateway, sessions, caller, tmp_path, "first")
    promote(gateway, sessions, caller, "1")
    client = gateway.client(caller.key)
    for _ in range(2):
        answer = client.chat.completions.create(model="billing", messages=ask("hi"))
        assert answer.choices[0].message.content == "reply from acme.billing-v1 to: hi"
    (load,) = gateway.loads()
    assert load["lora_name"] == "acme.billing-v1"
    files = Path(load["lora_path"])
    assert files == gateway.settings.home.resolve() / "adapters" / "acme.billing-v1"
    assert json.loads((files / "adapter_config.json").read_text()) == {"marker": "first"}
    assert [chat["body"]["model"] for chat in gateway.chats()] == ["acme.billing-v1"] * 2

    recorded = rows(gateway, sessions)
    assert len(recorded) == 2
    for row in recorded:
        assert (row.model_name, row.model_version) == ("acme.billing", "1")
        assert (row.adapter, row.release_role) == ("acme.billing-v1", "champion")
        assert row.end_user == str(caller.key_id)  # no `user`, no header: the key


def test_an_upstream_that_lost_its_adapters_gets_them_loaded_again(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller, tmp_path: Path
) -> None:
    register(gateway, sessions, caller, tmp_path, "first")
    promote(gateway, sessions, caller, "1")
    client = gateway.client(caller.key)
    client.chat.completions.create(model="billing", messages=ask("hi"))
    gateway.standin.app.adapters.clear()  # the upstream restarted
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(model="billing", messages=ask("hi"))
    assert raised.value.status_code == 502
    answer = client.chat.completions.create(model="billing", messages=ask("hi"))
    assert answer.choices[0].message.content == "reply from acme.billing-v1 to: hi"
    assert [load["lora_name"] for load in gateway.loads()] == ["acme.billing-v1"] * 2
    assert [row.status for row in rows(gateway, sessions)] == ["ok", "failed", "ok"]


def test_feedback_on_a_served_call_goes_through_the_rest_api(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller
) -> None:
    answer = gateway.client(caller.key).chat.completions.create(
        model="billing", messages=ask("rate me")
    )
    interaction_id = answer.model_extra["flywheel"]["interaction_id"]  # type: ignore[index]
    gateway.flush()
    with TestClient(create_app(gateway.settings, sessions=sessions)) as rest:
        created = rest.post(
            "/v1/feedback",
            headers=caller.headers,
            json={"interaction_id": interaction_id, "kind": "rating", "value": {"thumbs": "up"}},
        )
    assert created.status_code == 201, created.text


def test_a_version_and_the_challenger_are_addressed_by_name(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller, tmp_path: Path
) -> None:
    register(gateway, sessions, caller, tmp_path, "first")
    promote(gateway, sessions, caller, "1")
    register(gateway, sessions, caller, tmp_path, "second")
    client = gateway.client(caller.key)
    served = {}
    for model in ("billing", "billing@champion", "billing@challenger", "billing:2", "billing:1"):
        answer = client.chat.completions.create(model=model, messages=ask("x"))
        assert answer.model == model
        meta = answer.model_extra["flywheel"]  # type: ignore[index]
        served[model] = (meta["version"], meta["role"])
    assert served == {
        "billing": ("1", "champion"),
        "billing@champion": ("1", "champion"),
        "billing@challenger": ("2", "challenger"),
        "billing:2": ("2", "pinned"),
        "billing:1": ("1", "pinned"),
    }
    roles = {(row.model_version, row.release_role) for row in rows(gateway, sessions)}
    assert roles == {("1", "champion"), ("2", "challenger"), ("2", "pinned"), ("1", "pinned")}
    models = [card.id for card in client.models.list()]
    assert models == ["billing", "billing@challenger"]


def test_the_canary_share_is_sticky_per_end_user_and_near_its_share(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller, tmp_path: Path
) -> None:
    register(gateway, sessions, caller, tmp_path, "first")
    promote(gateway, sessions, caller, "1")
    register(gateway, sessions, caller, tmp_path, "second")
    set_release(sessions, caller, challenger_share=0.5)
    gateway.app.state.gateway.router.ttl_s = 60  # one read of the release for the 230 calls
    client = gateway.client(caller.key)
    users = [f"user-{i}" for i in range(200)]
    first: dict[str, str] = {}
    for user in users:
        answer = client.chat.completions.create(model="billing", messages=ask("x"), user=user)
        first[user] = answer.model_extra["flywheel"]["version"]  # type: ignore[index]
    for user in users[:30]:  # the same user always gets the same version
        answer = client.chat.completions.create(model="billing", messages=ask("y"), user=user)
        assert answer.model_extra["flywheel"]["version"] == first[user]  # type: ignore[index]
    challenged = sum(version == "2" for version in first.values())
    bound = 4 * math.sqrt(200 * 0.5 * 0.5)  # four standard deviations of Binomial(200, 0.5)
    assert abs(challenged - 100) <= bound, challenged
    assert set(first.values()) == {"1", "2"}


def test_shadow_mode_returns_the_champion_and_records_the_challenger_too(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller, tmp_path: Path
) -> None:
    register(gateway, sessions, caller, tmp_path, "first")
    promote(gateway, sessions, caller, "1")
    register(gateway, sessions, caller, tmp_path, "second")
    set_release(sessions, caller, challenger_share=1.0, shadow=True)
    answer = gateway.client(caller.key).chat.completions.create(
        model="billing", messages=ask("shadow me")
    )
    assert answer.choices[0].message.content == "reply from acme.billing-v1 to: shadow me"
    deadline = time.monotonic() + 10
    while len(recorded := rows(gateway, sessions)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    served = {(row.model_version, row.release_role, row.response) for row in recorded}
    assert served == {
        ("1", "champion", "reply from acme.billing-v1 to: shadow me"),
        ("2", "shadow", "reply from acme.billing-v2 to: shadow me"),
    }


# Streams and tools.


def test_a_stream_passes_chunks_through_and_records_time_to_first_token(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller
) -> None:
    client = gateway.client(caller.key)
    stream = client.chat.completions.create(
        model="billing", messages=ask("stream this please"), stream=True
    )
    chunks = list(stream)
    header = stream.response.headers["x-flywheel-interaction-id"]
    assert chunks[0].model_extra["flywheel"]["interaction_id"] == header  # type: ignore[index]
    assert {chunk.model for chunk in chunks} == {"billing"}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == f"reply from {BASE} to: stream this please"
    assert all(chunk.usage is None for chunk in chunks)  # asked for by the gateway, not shown
    assert gateway.chats()[0]["body"]["stream_options"] == {"include_usage": True}

    with_usage = list(
        client.chat.completions.create(
            model="billing",
            messages=ask("count"),
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert with_usage[-1].usage is not None
    assert with_usage[-1].choices == []

    first, second = rows(gateway, sessions)
    assert str(first.id) == header
    assert (first.status, first.response, first.finish_reason) == ("ok", text, "stop")
    assert first.ttft_ms is not None
    assert 0 < first.ttft_ms <= first.latency_ms
    assert first.completion_tokens == len(text.split())
    assert second.completion_tokens == with_usage[-1].usage.completion_tokens


def test_tool_calls_round_trip(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller
) -> None:
    client = gateway.client(caller.key)
    messages: list[Any] = ask("call get_weather for Paris")
    answer = client.chat.completions.create(model="billing", messages=messages, tools=[WEATHER])
    (call,) = answer.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "call get_weather for Paris"}  # type: ignore[union-attr]
    assert answer.choices[0].finish_reason == "tool_calls"
    messages += [
        answer.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    follow_up = client.chat.completions.create(model="billing", messages=messages, tools=[WEATHER])
    assert follow_up.choices[0].message.content == f"reply from {BASE} to tool result: sunny"

    streamed = list(
        client.chat.completions.create(
            model="billing", messages=ask("call get_weather now"), tools=[WEATHER], stream=True
        )
    )
    assert any(c.choices and c.choices[0].delta.tool_calls for c in streamed)

    first, second, third = rows(gateway, sessions)
    assert first.response_tool_calls == [call.model_dump()]
    assert first.tools == [WEATHER]
    assert second.messages[-1]["role"] == "tool"
    assert third.response_tool_calls[0]["function"]["name"] == "get_weather"  # type: ignore[index]
    assert json.loads(third.response_tool_calls[0]["function"]["arguments"]) == {  # type: ignore[index]
        "city": "call get_weather now"
    }


# Bad input: each refused in OpenAI's shape; a call that was made is recorded as failed.


def test_unknown_models_and_other_tenants_domains_are_404(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller
) -> None:
    make_caller(sessions, tenant="globex", domain="payroll", scopes=SCOPES)
    client = gateway.client(caller.key)
    for model in ("payroll", "nothing", "billing:7", "billing@challenger", "billing@beta"):
        with pytest.raises(openai.NotFoundError) as raised:
            client.chat.completions.create(model=model, messages=ask("x"))
        error = error_of(raised.value)
        assert (error["code"], error["type"]) == ("not_found", "invalid_request_error")
    assert [card.id for card in client.models.list()] == ["billing"]
    assert gateway.chats() == []
    assert rows(gateway, sessions) == []


def test_keys_without_the_infer_scope_or_unknown_keys_are_refused(
    gateway: Served, sessions: sessionmaker[Session]
) -> None:
    writer = make_caller(sessions, scopes=("feedback:write",))
    with pytest.raises(openai.PermissionDeniedError) as raised:
        gateway.client(writer.key).chat.completions.create(model="billing", messages=ask("x"))
    assert error_of(raised.value)["type"] == "permission_error"
    with pytest.raises(openai.AuthenticationError) as unknown:
        gateway.client("fwk_" + "0" * 16 + "_" + "a" * 43).models.list()
    assert error_of(unknown.value)["code"] == "unauthenticated"
    assert gateway.chats() == []


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {}}]}, "tools.0.function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "tool", "tool_call_id": "c1", "content": "x"}]}, "messages"),
        ({"messages": []}, "messages"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
             "function": {"name": "f", "arguments": "not json"}}]}]},
            "messages.0.tool_calls.0.function.arguments",
        ),
        ({"n": 2}, "n"),
        ({"temperature": 3}, "temperature"),
        ({"logit_bias": {"1": 2}}, "logit_bias"),
    ],
)  # fmt: skip
def test_malformed_requests_are_422_and_reach_no_upstream(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller, fields: Any, param: str
) -> None:
    body = {"messages": ask("x")} | fields
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        gateway.client(caller.key).chat.completions.create(
            model="billing", messages=body.pop("messages"), extra_body=body
        )
    error = error_of(raised.value)
    assert (error["code"], error["param"]) == ("invalid_input", param)
    assert gateway.chats() == []


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("fault", "status", "kind"),
    [("status=500", 502, "upstream_error"), ("hang", 504, "timeout")],
)
def test_upstream_failures_are_502_or_504_and_recorded_failed(
    gateway: Served,
    sessions: sessionmaker[Session],
    caller: Caller,
    fault: str,
    status: int,
    kind: str,
    stream: bool,
) -> None:
    with pytest.raises(openai.APIStatusError) as raised:  # a stream: before its first chunk
        gateway.client(caller.key).chat.completions.create(
            model="billing", messages=ask(f"fail [standin:{fault}]"), stream=stream
        )
    assert raised.value.status_code == status
    assert error_of(raised.value)["code"] == kind
    (row,) = rows(gateway, sessions)
    assert (row.status, row.release_role) == ("failed", "base")
    assert row.error


def test_a_stream_the_upstream_drops_ends_with_an_error_event_and_is_recorded_failed(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller
) -> None:
    stream = gateway.client(caller.key).chat.completions.create(
        model="billing", messages=ask("a b c d e f g h [standin:drop-after=2]"), stream=True
    )
    got = []
    with pytest.raises(openai.APIError, match="stream"):
        got.extend(stream)
    assert got  # the chunks before the break came through
    (row,) = rows(gateway, sessions)
    assert row.status == "failed"
    assert row.error


def test_a_client_that_abandons_a_stream_closes_the_upstream_stream(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller
) -> None:
    stream = gateway.client(caller.key).chat.completions.create(
        model="billing",
        messages=ask("slow one two three [standin:chunk-delay-ms=400]"),
        stream=True,
    )
    next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 10
    while not gateway.chats()[0].get("disconnected") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gateway.chats()[0]["disconnected"] is True
    deadline = time.monotonic() + 10
    while not (recorded := rows(gateway, sessions)) and time.monotonic() < deadline:
        time.sleep(0.05)
    (row,) = recorded
    assert (row.status, row.error) == ("failed", "client disconnected")


def test_metrics_include_the_recorders_counters(
    gateway: Served, sessions: sessionmaker[Session], caller: Caller
) -> None:
    gateway.client(caller.key).chat.completions.create(model="billing", messages=ask("x"))
    gateway.flush()
    text = httpx.get(f"http://127.0.0.1:{gateway.port}/metrics").text
    assert "flywheel_gateway_records_recorded_total 1.0" in text
    assert 'route="/v1/chat/completions"' in text


def test_a_key_past_its_rate_limit_gets_429_with_retry_after(
    standin: RunningStandin,
    committing_engine: Engine,
    session_settings: Settings,
    sessions: sessionmaker[Session],
    caller: Caller,
    tmp_path: Path,
) -> None:
    limits = {"rate_limit_per_s": 0.01, "rate_limit_burst": 2}
    with serve_gateway(standin, committing_engine, session_settings, tmp_path, **limits) as gw:
        client = gw.client(caller.key)
        for _ in range(2):
            client.chat.completions.create(model="billing", messages=ask("x"))
        with pytest.raises(openai.RateLimitError) as raised:
            client.chat.completions.create(model="billing", messages=ask("x"))
        assert int(raised.value.response.headers["retry-after"]) >= 1
        assert error_of(raised.value)["type"] == "rate_limit_error"
        assert len(gw.chats()) == 2


def test_an_unreachable_shared_store_is_a_503_in_openai_shape_not_a_500(
    standin: RunningStandin,
    committing_engine: Engine,
    session_settings: Settings,
    caller: Caller,
    tmp_path: Path,
) -> None:
    """FLYWHEEL_REDIS_URL set but nothing listening there: the gateway says it is unavailable,
    as the REST API does, and asks nothing of the upstream."""
    closed = {"redis_url": SecretStr("redis://127.0.0.1:1/0")}
    with serve_gateway(standin, committing_engine, session_settings, tmp_path, **closed) as gw:
        client = gw.client(caller.key).with_options(max_retries=0)
        with pytest.raises(openai.InternalServerError) as raised:
            client.chat.completions.create(model="billing", messages=ask("x"))
        assert raised.value.status_code == 503
        assert int(raised.value.response.headers["retry-after"]) >= 1
        assert error_of(raised.value)["code"] == "shared_store_unavailable"
        assert gw.chats() == []

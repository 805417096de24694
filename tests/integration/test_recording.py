"""The gateway's recorder: calls land as interactions with every column, in few set-based
transactions, redacted; a database that cannot be reached sends them to the spool, replayed
exactly once when it is back; a full spool drops and counts; a crash mid-replay duplicates
nothing; `aclose()` leaves nothing behind; a record never lands under another tenant.

The recorder writes from worker threads in its own transactions, so every test commits. A
database that is down is an engine pointed at a port nobody listens on (PostgreSQL) or a file
in a directory that does not exist (SQLite): the machine's PostgreSQL is never stopped.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import create_engine, event, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import make_session_factory
from flywheel.inference.recording import CallRecord, Recorder, recorder_collector
from flywheel.inference.spool import Spool
from flywheel.models import Interaction
from flywheel.settings import Settings
from flywheel.signals.compile.items import Texts, group_key_of
from flywheel.signals.message_texts import map_texts
from tests.conftest import Caller, count_rows

pytestmark = pytest.mark.commits("the recorder writes from worker threads, in its own transactions")

EMAIL = "jane.doe@example.com"
TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


def run(scenario: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(scenario)


def call(caller: Caller, domain_id: uuid.UUID, **changes: Any) -> CallRecord:
    fields: dict[str, Any] = {
        "interaction_id": uuid.uuid4(),
        "tenant_id": caller.tenant_id,
        "domain_id": domain_id,
        "messages": [{"role": "user", "content": "What is my balance?"}],
        "tools": None,
        "response": "42 dollars.",
        "response_tool_calls": None,
        "model_name": "acme.billing",
        "model_version": "3",
        "adapter": "acme.billing-v3",
        "release_role": "champion",
        "end_user": "u-42",
        "status": "ok",
        "error": None,
        "finish_reason": "stop",
        "prompt_tokens": 12,
        "completion_tokens": 3,
        "latency_ms": 81.5,
        "ttft_ms": 20.25,
        "created_at": datetime(2026, 12, 1, 12, 0, tzinfo=UTC),
    }
    return CallRecord(**(fields | changes))


def domain_id_of(sessions: sessionmaker[Session], caller: Caller) -> uuid.UUID:
    from flywheel.models import Domain

    with sessions() as session:
        return session.scalars(select(Domain.id).where(Domain.tenant_id == caller.tenant_id)).one()


@pytest.fixture
def domain_id(sessions: sessionmaker[Session], acme: Caller) -> uuid.UUID:
    return domain_id_of(sessions, acme)


@pytest.fixture
def recorder_settings(settings: Settings, tmp_path: Path) -> Settings:
    return settings.model_copy(update={"gateway_spool_path": tmp_path / "spool.jsonl"})


def rows(sessions: sessionmaker[Session]) -> list[Interaction]:
    with sessions() as session:
        return list(session.scalars(select(Interaction).order_by(Interaction.created_at)))


class Switch:
    """A session factory whose database can be swapped: down, then back."""

    def __init__(self, target: Callable[[], Session]) -> None:
        self.target = target

    def __call__(self) -> Session:
        return self.target()


@pytest.fixture
def down(engine: Engine, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    """Sessions on a database nobody serves."""
    if engine.dialect.name == "postgresql":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/flywheel?connect_timeout=2"
    else:
        url = f"sqlite:///{tmp_path / 'missing' / 'directory' / 'flywheel.db'}"
    unreachable = create_engine(url)
    yield make_session_factory(unreachable)
    unreachable.dispose()


def test_a_call_lands_with_every_column(
    sessions: sessionmaker[Session], recorder_settings: Settings, acme: Caller, domain_id: uuid.UUID
) -> None:
    tools = [{"type": "function", "function": {"name": "balance", "parameters": {}}}]
    tool_calls = [
        {"id": "c1", "type": "function", "function": {"name": "balance", "arguments": "{}"}}
    ]
    record = call(acme, domain_id, tools=tools, response="", response_tool_calls=tool_calls)
    failed = call(
        acme,
        domain_id,
        model_version=None,
        adapter=None,
        release_role="base",
        status="failed",
        error="upstream timed out",
        finish_reason=None,
        prompt_tokens=None,
        completion_tokens=None,
        ttft_ms=None,
        created_at=datetime(2026, 12, 1, 12, 1, tzinfo=UTC),
    )

    async def scenario() -> dict[str, int]:
        recorder = Recorder(sessions, recorder_settings)
        await recorder.start()
        recorder.submit(record)
        recorder.submit(failed)
        await recorder.flush()
        await recorder.aclose()
        return recorder.counters

    counters = run(scenario())
    assert counters["recorded"] == 2
    assert counters["dropped"] == counters["spooled"] == counters["queue_depth"] == 0
    served, broken = rows(sessions)
    assert served.id == record.interaction_id
    assert (served.tenant_id, served.domain_id) == (acme.tenant_id, domain_id)
    assert served.messages == record.messages
    assert served.tools == tools
    assert (served.response, served.response_tool_calls) == ("", tool_calls)
    assert (served.model_name, served.model_version, served.adapter) == (
        "acme.billing",
        "3",
        "acme.billing-v3",
    )
    assert (served.release_role, served.end_user, served.status, served.error) == (
        "champion",
        "u-42",
        "ok",
        None,
    )
    assert (served.finish_reason, served.prompt_tokens, served.completion_tokens) == ("stop", 12, 3)
    assert (served.latency_ms, served.ttft_ms) == (81.5, 20.25)
    assert served.created_at == record.created_at
    assert served.metadata_ == {"source": "gateway", "redaction": {"total": 0, "counts": {}}}
    assert len(served.request_sha256) == 64
    assert (broken.status, broken.error, broken.release_role) == (
        "failed",
        "upstream timed out",
        "base",
    )
    assert (broken.model_version, broken.prompt_tokens, broken.ttft_ms) == (None, None, None)


def test_500_calls_are_written_in_few_transactions(
    sessions: sessionmaker[Session],
    committing_engine: Engine,
    recorder_settings: Settings,
    acme: Caller,
    domain_id: uuid.UUID,
) -> None:
    commits: list[int] = []

    def count_commit(_connection: object) -> None:
        commits.append(1)

    async def scenario() -> dict[str, int]:
        recorder = Recorder(sessions, recorder_settings, batch_size=200)
        await recorder.start()
        for index in range(500):
            recorder.submit(call(acme, domain_id, response=f"answer {index}"))
        await recorder.flush()
        await recorder.aclose()
        return recorder.counters

    event.listen(committing_engine, "commit", count_commit)
    try:
        counters = run(scenario())
    finally:
        event.remove(committing_engine, "commit", count_commit)
    assert counters["recorded"] == 500
    assert count_rows(sessions, "interactions") == 500
    assert len(commits) == 3  # 200 + 200 + 100, one transaction each


@pytest.mark.parametrize("in_child", [False, True], ids=["in-thread", "in-child-process"])
def test_texts_are_redacted_before_they_are_written(
    sessions: sessionmaker[Session],
    recorder_settings: Settings,
    acme: Caller,
    domain_id: uuid.UUID,
    in_child: bool,
) -> None:
    arguments = orjson.dumps({"token": TOKEN, "account": 7}).decode()
    messages = [
        {"role": "user", "content": f"Send the invoice to {EMAIL} please"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "auth", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": f"sent to {EMAIL}"},
    ]
    response_calls = [
        {"id": "c2", "type": "function", "function": {"name": "auth", "arguments": arguments}}
    ]
    record = call(
        acme,
        domain_id,
        messages=messages,
        response=f"Done, {EMAIL} has it.",
        response_tool_calls=response_calls,
    )

    async def scenario() -> None:
        recorder = Recorder(sessions, recorder_settings, redact_in_child=in_child)
        await recorder.start()
        recorder.submit(record)
        await recorder.aclose()

    run(scenario())
    (stored,) = rows(sessions)
    stored_json = orjson.dumps([stored.messages, stored.response, stored.response_tool_calls])
    assert EMAIL.encode() not in stored_json
    assert TOKEN.encode() not in stored_json
    assert stored.metadata_["redaction"]["counts"] == {"EMAIL": 3, "SECRET": 2}
    assert stored.metadata_["redaction"]["total"] == 5
    # The arguments stay a JSON object, their keys and non-texts as they were.
    arguments_stored = orjson.loads(stored.response_tool_calls[0]["function"]["arguments"])
    assert set(arguments_stored) == {"token", "account"}
    assert arguments_stored["account"] == 7
    assert stored.messages[0]["content"].startswith("Send the invoice to ")
    # Exactly what the feedback compiler stores for this conversation and response.
    texts, group_key = Texts(), group_key_of(orjson.dumps(messages).decode())
    compiled = [map_texts(message, lambda raw: texts(raw, group_key).text) for message in messages]
    assert stored.messages == compiled
    assert stored.response == texts(record.response, group_key).text
    # The same address is the same surrogate within the call, in the prompt and the response.
    surrogate = stored.messages[0]["content"].removeprefix("Send the invoice to ").split()[0]
    assert surrogate in stored.response


def test_a_redaction_process_that_dies_loses_nothing_and_is_replaced(
    sessions: sessionmaker[Session], recorder_settings: Settings, acme: Caller, domain_id: uuid.UUID
) -> None:
    async def scenario() -> tuple[list[int], dict[str, int]]:
        recorder = Recorder(sessions, recorder_settings, redact_in_child=True)
        await recorder.start()
        children: list[int] = []
        for round_ in range(3):
            for index in range(5):
                recorder.submit(call(acme, domain_id, response=f"{round_}.{index} to {EMAIL}"))
            await recorder.flush()
            pool = recorder._worker._pool  # type: ignore[union-attr]
            (child,) = pool._processes.values()  # type: ignore[union-attr]
            children.append(child.pid)
            os.kill(child.pid, signal.SIGKILL)  # the next batch finds it dead
            child.join(10)
        await recorder.aclose()
        return children, recorder.counters

    children, counters = run(scenario())
    assert len(set(children)) == 3  # a fresh child after each death
    assert (counters["recorded"], counters["dropped"]) == (15, 0)
    stored = rows(sessions)
    assert len(stored) == 15
    assert all(EMAIL not in row.response for row in stored)


def test_a_call_made_once_the_database_is_back_is_written_by_the_next_flush(
    sessions: sessionmaker[Session],
    down: sessionmaker[Session],
    recorder_settings: Settings,
    acme: Caller,
    domain_id: uuid.UUID,
) -> None:
    """A background step that has the write lock before the flush (it waits for it while a
    spool is replayed) took the new call and spooled it, since the database had failed a
    moment before: `recorded` was 0 (the CI failure of the test below, on a loaded machine)."""
    database = Switch(down)
    outage = [call(acme, domain_id, response=f"during the outage {n}") for n in range(2)]
    after = call(acme, domain_id, response="after")

    async def scenario() -> dict[str, int]:
        earlier = Recorder(database, recorder_settings)  # leaves a spool behind
        earlier.submit(outage[0])
        await earlier.flush()
        await earlier.aclose()
        recorder = Recorder(database, recorder_settings)
        await recorder.start()  # it replays the spool first: its step waits for the lock
        recorder.submit(outage[1])
        await recorder.flush()  # the database fails again, just now
        database.target = sessions  # and is back
        recorder.submit(after)
        await recorder.flush()
        await recorder.aclose()
        return recorder.counters

    counters = run(scenario())
    assert counters["recorded"] == 1
    assert counters["replayed"] == 2
    assert {row.id for row in rows(sessions)} == {r.interaction_id for r in [*outage, after]}


def test_a_database_that_is_down_sends_calls_to_the_spool_replayed_once(
    sessions: sessionmaker[Session],
    down: sessionmaker[Session],
    recorder_settings: Settings,
    acme: Caller,
    domain_id: uuid.UUID,
) -> None:
    database = Switch(down)
    first = [call(acme, domain_id, response=f"during the outage {EMAIL} {n}") for n in range(3)]
    after = call(acme, domain_id, response="after")
    spool_path = recorder_settings.resolved_gateway_spool_path

    async def scenario() -> tuple[dict[str, int], list[bytes], dict[str, int]]:
        recorder = Recorder(database, recorder_settings)
        await recorder.start()
        for record in first:
            recorder.submit(record)
        await recorder.flush()
        during = recorder.counters
        spooled = spool_path.read_bytes().splitlines()
        database.target = sessions  # the database is back
        recorder.submit(after)
        await recorder.flush()
        await recorder.aclose()
        return during, spooled, recorder.counters

    during, spooled, counters = run(scenario())
    assert during["spooled"] == 3
    assert during["recorded"] == during["dropped"] == 0
    assert during["spool_bytes"] == sum(len(line) + 1 for line in spooled)
    assert len(spooled) == 3
    assert all(EMAIL.encode() not in line for line in spooled)  # redacted before the disk
    assert counters["recorded"] == 1
    assert counters["replayed"] == 3
    assert counters["spool_bytes"] == 0
    assert not spool_path.exists()
    assert {row.id for row in rows(sessions)} == {r.interaction_id for r in [*first, after]}

    async def restart() -> dict[str, int]:
        again = Recorder(sessions, recorder_settings)
        await again.start()
        await again.flush()
        await again.aclose()
        return again.counters

    assert run(restart())["replayed"] == 0
    assert count_rows(sessions, "interactions") == 4


def test_a_spool_left_by_an_earlier_run_is_replayed_at_start(
    sessions: sessionmaker[Session],
    down: sessionmaker[Session],
    recorder_settings: Settings,
    acme: Caller,
    domain_id: uuid.UUID,
) -> None:
    records = [call(acme, domain_id) for _ in range(4)]

    async def outage() -> dict[str, int]:
        recorder = Recorder(down, recorder_settings)
        await recorder.start()
        for record in records:
            recorder.submit(record)
        await recorder.aclose()  # what could not be written is spooled
        return recorder.counters

    async def next_start() -> dict[str, int]:
        recorder = Recorder(sessions, recorder_settings, retry_interval_s=0.05)
        await recorder.start()
        for _ in range(200):  # the background task replays without being asked
            if recorder.counters["replayed"] == 4:
                break
            await asyncio.sleep(0.05)
        await recorder.aclose()
        return recorder.counters

    assert run(outage())["spooled"] == 4
    assert run(next_start())["replayed"] == 4
    assert count_rows(sessions, "interactions") == 4


def test_a_full_spool_drops_and_counts(
    sessions: sessionmaker[Session],
    down: sessionmaker[Session],
    recorder_settings: Settings,
    acme: Caller,
    domain_id: uuid.UUID,
) -> None:
    small = recorder_settings.model_copy(update={"gateway_spool_max_mb": 4096 / 1024 / 1024})

    async def scenario() -> Recorder:
        recorder = Recorder(down, small)
        await recorder.start()
        for _ in range(20):
            recorder.submit(call(acme, domain_id))
        await recorder.aclose()
        return recorder

    recorder = run(scenario())
    counters = recorder.counters
    assert 0 < counters["spooled"] < 20
    assert counters["dropped"] == recorder.dropped["spool_full"] == 20 - counters["spooled"]
    assert counters["spool_bytes"] <= 4096
    assert len(small.resolved_gateway_spool_path.read_bytes().splitlines()) == counters["spooled"]
    registry = CollectorRegistry()
    registry.register(recorder_collector(recorder))
    scraped = generate_latest(registry).decode()
    assert (
        f'flywheel_gateway_records_dropped_total{{reason="spool_full"}} {counters["dropped"]}.0'
        in scraped
    )
    assert f"flywheel_gateway_records_spooled_total {counters['spooled']}.0" in scraped
    assert f"flywheel_gateway_spool_bytes {counters['spool_bytes']}.0" in scraped


def test_a_crash_mid_replay_loses_nothing_and_writes_nothing_twice(
    sessions: sessionmaker[Session],
    down: sessionmaker[Session],
    recorder_settings: Settings,
    acme: Caller,
    domain_id: uuid.UUID,
) -> None:
    records = [call(acme, domain_id, response=f"answer {n}") for n in range(5)]
    spool = Spool(recorder_settings.resolved_gateway_spool_path, 1 << 20)

    async def outage() -> None:
        recorder = Recorder(down, recorder_settings)
        await recorder.start()
        for record in records:
            recorder.submit(record)
        await recorder.aclose()

    async def crashes_after_one_chunk() -> dict[str, int]:
        # Writes the first chunk of 2 and dies before the rest: the claimed file stays, and a
        # dead process holds no lock (closing its descriptor is what dying does to a flock).
        recorder = Recorder(sessions, recorder_settings, batch_size=2)
        assert await asyncio.to_thread(recorder._replay_chunk)
        recorder.spool.close()
        return recorder.counters

    async def restarts() -> dict[str, int]:
        recorder = Recorder(sessions, recorder_settings, batch_size=2)
        await recorder.start()
        await recorder.flush()
        await recorder.aclose()
        return recorder.counters

    run(outage())
    crashed = run(crashes_after_one_chunk())
    assert crashed["replayed"] == 2
    assert spool.replaying.exists()  # mid-replay: the claimed file is still there
    assert count_rows(sessions, "interactions") == 2
    after = run(restarts())
    assert after["replayed"] == 3  # the 2 already written are skipped by their id
    assert after["duplicates"] == 2
    assert not spool.replaying.exists()
    assert not spool.path.exists()
    assert sorted(row.response for row in rows(sessions)) == [f"answer {n}" for n in range(5)]


def test_a_torn_last_line_is_counted_and_the_rest_replayed(
    sessions: sessionmaker[Session],
    down: sessionmaker[Session],
    recorder_settings: Settings,
    acme: Caller,
    domain_id: uuid.UUID,
) -> None:
    path = recorder_settings.resolved_gateway_spool_path

    async def outage() -> None:
        recorder = Recorder(down, recorder_settings)
        await recorder.start()
        recorder.submit(call(acme, domain_id))
        await recorder.aclose()

    run(outage())
    with path.open("ab") as handle:  # a crash in the middle of an append
        handle.write(b'{"id": "a')
    run(outage())  # the next append starts on a line of its own

    async def replay() -> Recorder:
        recorder = Recorder(sessions, recorder_settings)
        await recorder.start()
        await recorder.flush()
        await recorder.aclose()
        return recorder

    recorder = run(replay())
    assert recorder.counters["replayed"] == 2
    assert recorder.dropped["torn"] == 1
    assert count_rows(sessions, "interactions") == 2


def test_a_full_queue_sends_calls_to_the_spool_and_past_that_drops(
    sessions: sessionmaker[Session], recorder_settings: Settings, acme: Caller, domain_id: uuid.UUID
) -> None:
    async def scenario() -> Recorder:
        recorder = Recorder(sessions, recorder_settings, queue_size=5, batch_size=5)
        await recorder.start()
        for _ in range(12):  # no await in between: the writer cannot take any yet
            recorder.submit(call(acme, domain_id))
        assert recorder.counters["queue_depth"] == 10
        await recorder.flush()
        await recorder.aclose()
        return recorder

    recorder = run(scenario())
    counters = recorder.counters
    assert (counters["recorded"], counters["spooled"], counters["replayed"]) == (5, 5, 5)
    assert counters["dropped"] == recorder.dropped["queue_full"] == 2
    assert count_rows(sessions, "interactions") == 10


def test_aclose_writes_everything_queued(
    sessions: sessionmaker[Session], recorder_settings: Settings, acme: Caller, domain_id: uuid.UUID
) -> None:
    async def scenario() -> dict[str, int]:
        recorder = Recorder(sessions, recorder_settings, batch_size=1000, flush_interval_ms=60_000)
        await recorder.start()
        for _ in range(50):
            recorder.submit(call(acme, domain_id))
        await asyncio.sleep(0.05)  # the writer is waiting for a full batch
        assert count_rows(sessions, "interactions") == 0
        await recorder.aclose()
        recorder.submit(call(acme, domain_id))  # too late: dropped, counted, no error
        return recorder.counters

    counters = run(scenario())
    assert counters["recorded"] == 50
    assert counters["dropped"] == 1
    assert count_rows(sessions, "interactions") == 50


def test_a_record_never_lands_under_another_tenant(
    sessions: sessionmaker[Session],
    recorder_settings: Settings,
    acme: Caller,
    globex: Caller,
    domain_id: uuid.UUID,
) -> None:
    mine = call(acme, domain_id)
    forged = call(globex, domain_id)  # globex's tenant, acme's domain
    unknown = call(acme, uuid.uuid4())

    async def scenario() -> Recorder:
        recorder = Recorder(sessions, recorder_settings)
        await recorder.start()
        for record in (mine, forged, unknown):
            recorder.submit(record)
        await recorder.aclose()
        return recorder

    recorder = run(scenario())
    assert recorder.counters["recorded"] == 1
    assert recorder.dropped["foreign_domain"] == 2
    assert [row.id for row in rows(sessions)] == [mine.interaction_id]


def test_a_row_the_database_refuses_is_dropped_alone(
    sessions: sessionmaker[Session], recorder_settings: Settings, acme: Caller, domain_id: uuid.UUID
) -> None:
    good = [call(acme, domain_id) for _ in range(3)]
    bad = call(acme, domain_id, release_role="canary")  # not a role: the check refuses it

    async def scenario() -> Recorder:
        recorder = Recorder(sessions, recorder_settings)
        await recorder.start()
        for record in (good[0], bad, *good[1:]):
            recorder.submit(record)
        await recorder.aclose()
        return recorder

    recorder = run(scenario())
    assert recorder.counters["recorded"] == 3
    assert recorder.dropped["refused"] == 1
    assert recorder.counters["spooled"] == 0
    assert {row.id for row in rows(sessions)} == {record.interaction_id for record in good}


def test_feedback_before_the_row_is_written_is_404_then_201(
    client: TestClient, sessions: sessionmaker[Session], recorder_settings: Settings, acme: Caller
) -> None:
    domain_id = domain_id_of(sessions, acme)
    record = call(acme, domain_id)
    feedback = {
        "interaction_id": str(record.interaction_id),
        "kind": "rating",
        "value": {"thumbs": "up"},
    }

    async def scenario() -> tuple[int, int]:
        recorder = Recorder(sessions, recorder_settings, flush_interval_ms=60_000)
        await recorder.start()
        recorder.submit(record)
        early = client.post("/v1/feedback", json=feedback, headers=acme.headers)
        await recorder.flush()
        late = client.post("/v1/feedback", json=feedback, headers=acme.headers)
        await recorder.aclose()
        assert early.json()["error"]["code"] == "not_found"
        return early.status_code, late.status_code

    assert run(scenario()) == (404, 201)


def test_each_registry_gets_its_own_collector(
    sessions: sessionmaker[Session], recorder_settings: Settings, acme: Caller, domain_id: uuid.UUID
) -> None:
    async def scenario() -> Recorder:
        recorder = Recorder(sessions, recorder_settings)
        await recorder.start()
        recorder.submit(call(acme, domain_id))
        await recorder.aclose()
        return recorder

    first, second = run(scenario()), run(scenario())
    scraped = []
    for recorder in (first, second):  # two app instances in one process: no clash
        registry = CollectorRegistry()
        registry.register(recorder_collector(recorder))
        scraped.append(generate_latest(registry).decode())
    for text in scraped:
        assert "flywheel_gateway_records_recorded_total 1.0" in text
        assert "flywheel_gateway_record_queue_depth 0.0" in text
        assert 'flywheel_gateway_records_dropped_total{reason="spool_full"} 0.0' in text


def test_while_the_database_is_down_batches_skip_it_until_the_next_retry(
    sessions: sessionmaker[Session],
    down: sessionmaker[Session],
    recorder_settings: Settings,
    acme: Caller,
    domain_id: uuid.UUID,
) -> None:
    attempts: list[int] = []

    def count_attempt(*_args: object) -> None:
        attempts.append(1)

    async def scenario() -> dict[str, int]:
        recorder = Recorder(
            down, recorder_settings, batch_size=2, flush_interval_ms=1, retry_interval_s=600
        )
        await recorder.start()
        for _ in range(2):
            recorder.submit(call(acme, domain_id))
        await recorder.flush()  # tries the database: down
        tried = len(attempts)
        for _ in range(6):
            recorder.submit(call(acme, domain_id))
        for _ in range(1000):  # the background writer takes three more batches
            if recorder.counters["spooled"] == 8:
                break
            await asyncio.sleep(0.01)
        assert len(attempts) == tried  # straight to the spool: no connection tried
        await recorder.aclose()
        return recorder.counters

    engine = down.kw["bind"]
    event.listen(engine, "do_connect", count_attempt)
    try:
        counters = run(scenario())
    finally:
        event.remove(engine, "do_connect", count_attempt)
    assert attempts
    assert counters["spooled"] == 8
    assert counters["recorded"] == counters["dropped"] == 0


def test_interactions_posted_through_the_api_are_ok_with_no_release_role(
    client: TestClient, sessions: sessionmaker[Session], acme: Caller
) -> None:
    body = {"domain": "billing", "messages": [{"role": "user", "content": "p"}], "response": "r"}
    posted = client.post("/v1/interactions", json=body, headers=acme.headers)
    assert posted.status_code == 201
    (stored,) = rows(sessions)
    assert (stored.status, stored.release_role, stored.end_user, stored.latency_ms) == (
        "ok",
        None,
        None,
        None,
    )


@pytest.mark.no_database
def test_the_spool_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path))
    monkeypatch.delenv("FLYWHEEL_GATEWAY_SPOOL_PATH", raising=False)
    monkeypatch.delenv("FLYWHEEL_GATEWAY_SPOOL_MAX_MB", raising=False)
    defaults = Settings()
    assert defaults.resolved_gateway_spool_path == tmp_path / "gateway-spool.jsonl"
    assert defaults.gateway_spool_max_mb == 256
    monkeypatch.setenv("FLYWHEEL_GATEWAY_SPOOL_PATH", str(tmp_path / "elsewhere.jsonl"))
    monkeypatch.setenv("FLYWHEEL_GATEWAY_SPOOL_MAX_MB", "0.5")
    configured = Settings()
    assert configured.resolved_gateway_spool_path == tmp_path / "elsewhere.jsonl"
    recorder = Recorder(sessionmaker(create_engine("sqlite://")), configured)
    assert recorder.spool.path == tmp_path / "elsewhere.jsonl"
    assert recorder.spool.max_bytes == 512 * 1024


@pytest.mark.no_database
def test_two_processes_sharing_a_spool_never_replay_it_both(tmp_path: Path) -> None:
    # Two Spool objects hold their own descriptors, as two worker processes would: flock
    # excludes the second from a replay the first has claimed.
    path = tmp_path / "spool.jsonl"
    first, second = Spool(path, 1 << 20), Spool(path, 1 << 20)
    assert first.append([b'{"n": 1}', b'{"n": 2}']) == 2
    chunk = first.next_chunk(10)
    assert chunk is not None
    assert chunk.lines == [b'{"n": 1}', b'{"n": 2}']
    assert second.next_chunk(10) is None  # claimed by the first
    assert second.append([b'{"n": 3}']) == 1  # goes to a fresh file, not the claimed one
    first.done(chunk)
    assert not first.replaying.exists()
    again = second.next_chunk(10)
    assert again is not None
    assert again.lines == [b'{"n": 3}']
    second.done(again)
    assert not path.exists()
    assert first.size_bytes() == second.size_bytes() == 0


def test_the_redaction_process_ends_when_its_gateway_is_killed_outright() -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\n"
            "from flywheel.inference.row_worker import RowWorker\n"
            "worker = RowWorker(b'k' * 32)\n"
            "assert worker.rows([]) == []\n"
            "print(*worker._pool._processes, flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    os.kill(child, 0)  # alive
    parent.kill()
    parent.wait(10)
    parent.stdout.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _is_alive(child):
        time.sleep(0.1)
    assert not _is_alive(child)


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waits for init to reap it: gone
        return stat.read().split(") ")[-1][0] != "Z"

"""The runs API: the caller's runs only, queueing a cycle with its job (PostgreSQL), refusing
a second queued one and the embedded database, cancelling; bad input is a 4xx."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.app import create_app
from flywheel import migrate
from flywheel.db import make_engine, make_session_factory, unit_of_work
from flywheel.models import Run
from flywheel.scheduling import jobs
from flywheel.scheduling.runs import queue_cycle
from flywheel.settings import Settings
from tests.conftest import Caller, make_caller

SCOPES = ("models:write", "data:read")


def queued(sessions: sessionmaker[Session], caller: Caller, domain: str = "billing") -> uuid.UUID:
    with unit_of_work(sessions) as session:
        run = queue_cycle(session, tenant_id=caller.tenant_id, domain=domain, trigger="manual")
        return run.id


def test_the_caller_sees_its_own_runs_only(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    acme = make_caller(sessions, scopes=SCOPES)
    globex = make_caller(sessions, tenant="globex", scopes=SCOPES)
    mine = queued(sessions, acme)
    theirs = queued(sessions, globex)
    with unit_of_work(sessions) as session:  # an older, finished one
        session.execute(update(Run).where(Run.id == mine).values(status="failed"))
    newer = queued(sessions, acme)

    listed = client.get("/v1/runs", headers=acme.headers)
    by_domain = client.get("/v1/runs?domain=billing&status=queued", headers=acme.headers)
    limited = client.get("/v1/runs?limit=1", headers=acme.headers)
    read = client.get(f"/v1/runs/{mine}", headers=acme.headers)
    other = client.get(f"/v1/runs/{theirs}", headers=acme.headers)
    unknown_domain = client.get("/v1/runs?domain=nope", headers=acme.headers)

    assert listed.status_code == 200, listed.text
    assert [item["id"] for item in listed.json()["items"]] == [str(newer), str(mine)]
    assert [item["id"] for item in by_domain.json()["items"]] == [str(newer)]
    assert [item["id"] for item in limited.json()["items"]] == [str(newer)]
    body = read.json()
    assert (body["id"], body["domain"], body["method"], body["status"]) == (
        str(mine),
        "billing",
        "cycle",
        "failed",
    )
    assert (body["trigger"], body["steps"], body["started_at"]) == ("manual", {}, None)
    assert other.status_code == 404
    assert other.json()["error"]["code"] == "not_found"
    assert str(theirs) not in listed.text
    assert unknown_domain.status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/v1/runs", {}),
        ("post", "/v1/runs", {"domain": "billing", "priority": 1}),
        ("post", "/v1/runs", {"domain": ""}),
        ("post", "/v1/runs", {"domain": 7}),
        ("get", "/v1/runs?status=done", None),
        ("get", "/v1/runs?limit=0", None),
        ("get", "/v1/runs?limit=5000", None),
        ("get", "/v1/runs/not-a-uuid", None),
        ("post", "/v1/runs/not-a-uuid/cancel", None),
    ],
)
def test_bad_input_is_422_and_writes_nothing(
    client: TestClient,
    sessions: sessionmaker[Session],
    method: str,
    path: str,
    body: dict[str, object] | None,
) -> None:
    caller = make_caller(sessions, scopes=SCOPES)

    response = client.request(method, path, json=body, headers=caller.headers)

    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_input"
    with sessions() as session:
        assert session.scalars(select(Run)).all() == []


def test_reading_needs_a_key_and_queueing_or_cancelling_needs_models_write(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    reader = make_caller(sessions, scopes=("data:read",))
    run_id = queued(sessions, reader)

    anonymous = client.get("/v1/runs")
    queue = client.post("/v1/runs", json={"domain": "billing"}, headers=reader.headers)
    cancel = client.post(f"/v1/runs/{run_id}/cancel", headers=reader.headers)

    assert anonymous.status_code == 401
    assert (queue.status_code, cancel.status_code) == (403, 403)


def test_cancelling_a_queued_run_ends_it_and_a_running_one_asks_it_to_stop(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    caller = make_caller(sessions, scopes=SCOPES)
    waiting = queued(sessions, caller)
    cancelled = client.post(f"/v1/runs/{waiting}/cancel", headers=caller.headers)
    again = client.post(f"/v1/runs/{waiting}/cancel", headers=caller.headers)
    running = queued(sessions, caller)
    with unit_of_work(sessions) as session:
        session.execute(update(Run).where(Run.id == running).values(status="running"))
    asked = client.post(f"/v1/runs/{running}/cancel", headers=caller.headers)
    stranger = make_caller(sessions, tenant="globex", scopes=SCOPES)
    not_theirs = client.post(f"/v1/runs/{running}/cancel", headers=stranger.headers)

    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["finished_at"] is not None
    assert again.status_code == 409
    assert "already finished (cancelled)" in again.json()["error"]["message"]
    assert asked.json()["status"] == "running"
    assert asked.json()["cancel_requested_at"] is not None
    assert not_theirs.status_code == 404
    with sessions() as session:
        assert session.get_one(Run, running).cancel_requested_at is not None


@pytest.fixture
def job_tables(settings: Settings, engine: Engine) -> Iterator[None]:
    jobs.apply_schema(settings)
    yield
    with engine.begin() as connection:
        connection.execute(text("TRUNCATE procrastinate_jobs, procrastinate_events CASCADE"))


def job_statuses(sessions: sessionmaker[Session]) -> list[tuple[int, str]]:
    with sessions() as session:
        rows = session.execute(text("SELECT id, status FROM procrastinate_jobs ORDER BY id"))
        return [(row.id, row.status) for row in rows]


@pytest.mark.postgres_only
@pytest.mark.usefixtures("job_tables")
def test_post_queues_a_cycle_with_its_job_and_refuses_a_second(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    caller = make_caller(sessions, scopes=SCOPES)

    first = client.post("/v1/runs", json={"domain": "billing"}, headers=caller.headers)
    second = client.post("/v1/runs", json={"domain": "billing"}, headers=caller.headers)
    unknown = client.post("/v1/runs", json={"domain": "nope"}, headers=caller.headers)

    assert first.status_code == 202, first.text
    body = first.json()
    assert (body["status"], body["method"], body["trigger"]) == ("queued", "cycle", "api")
    assert second.status_code == 409
    assert "already queued" in second.json()["error"]["message"]
    assert unknown.status_code == 404
    with sessions() as session:
        [run] = session.scalars(select(Run)).all()
    assert str(run.id) == body["id"]
    assert job_statuses(sessions) == [(run.job_id, "todo")]

    cancelled = client.post(f"/v1/runs/{run.id}/cancel", headers=caller.headers)

    assert cancelled.json()["status"] == "cancelled"
    assert job_statuses(sessions) == [(run.job_id, "cancelled")]


def test_the_embedded_database_refuses_to_queue_with_a_clear_message(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flywheel.db'}"
    migrate.upgrade(url)
    settings = Settings(database_url=url, home=tmp_path, auth_cache_ttl_s=0)
    engine = make_engine(settings)
    sessions = make_session_factory(engine)
    caller = make_caller(sessions, scopes=SCOPES)
    try:
        with TestClient(create_app(settings)) as client:
            response = client.post("/v1/runs", json={"domain": "billing"}, headers=caller.headers)
        with sessions() as session:
            assert session.scalars(select(Run)).all() == []
    finally:
        engine.dispose()

    assert response.status_code == 409
    assert response.json()["error"] == {"code": "invalid_state", "message": jobs.POSTGRES_ONLY}

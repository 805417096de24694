"""Rate limits per key, health, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from api.app import create_app
from flywheel.settings import Settings
from tests.conftest import RATING, Caller, count_rows, make_caller


def test_rate_limit_is_429_with_retry_after_per_key(
    settings: Settings, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    other = make_caller(sessions, tenant="globex")
    limited = settings.model_copy(update={"rate_limit_per_s": 0.01, "rate_limit_burst": 2})
    with TestClient(create_app(limited, sessions=sessions)) as client:
        statuses = [
            client.post("/v1/feedback", json=RATING, headers=acme.headers).status_code
            for _ in range(3)
        ]
        refused = client.post("/v1/feedback", json=RATING, headers=acme.headers)
        other_key = client.post("/v1/feedback", json=RATING, headers=other.headers)

    assert statuses == [201, 201, 429]
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 1
    assert other_key.status_code == 201
    assert count_rows(sessions, "feedback_events") == 3


def test_healthz_and_readyz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert (ready.status_code, ready.json()) == (200, {"status": "ok"})


def test_readyz_is_503_when_the_database_is_unreachable(settings: Settings) -> None:
    broken = settings.model_copy(
        update={
            "database_url": SecretStr(
                "postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1"
            )
        }
    )
    with TestClient(create_app(broken)) as client:
        response = client.get("/readyz")

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "database_unavailable"


def test_metrics_count_requests_and_ingested_events(client: TestClient, acme: Caller) -> None:
    client.post("/v1/feedback", json=RATING, headers=acme.headers)
    client.post("/v1/feedback", json={**RATING, "value": {"stars": 9}}, headers=acme.headers)

    text = client.get("/metrics").text

    assert (
        'flywheel_http_requests_total{method="POST",route="/v1/feedback",status="201"} 1.0' in text
    )
    assert (
        'flywheel_http_requests_total{method="POST",route="/v1/feedback",status="422"} 1.0' in text
    )
    assert 'flywheel_events_ingested_total{kind="rating"} 1.0' in text
    assert "flywheel_http_request_duration_seconds_bucket" in text

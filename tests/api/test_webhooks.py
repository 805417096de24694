"""Webhooks over the API: a promotion through the API is announced after its response, the
champion names the move, and each tenant lists only its own deliveries."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from flywheel.registry.mlflow_registry import MlflowRegistry
from tests.conftest import make_caller
from tests.integration.test_registry import PASSED, register
from tests.integration.test_webhooks import configure, serve_receiver

SCOPES = ("models:write", "data:read")


def test_api_moves_are_announced_and_listed_per_tenant(
    client: TestClient,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    acme = make_caller(sessions, scopes=SCOPES)
    globex = make_caller(sessions, tenant="globex", scopes=SCOPES)
    registry = MlflowRegistry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client.app.state.registry = registry  # type: ignore[attr-defined]
    register(sessions, registry, acme, tmp_path, "one", PASSED)
    register(sessions, registry, globex, tmp_path, "theirs", PASSED)

    with serve_receiver() as receiver:
        configure(monkeypatch, receiver.url)
        moved = client.post(
            "/v1/models/billing/promote", json={"version": "1"}, headers=acme.headers
        )
        assert moved.status_code == 200, moved.text
        theirs = client.post(
            "/v1/models/billing/promote", json={"version": "1"}, headers=globex.headers
        )
        assert theirs.status_code == 200, theirs.text

    assert [item.is_signed for item in receiver.received] == [True, True]
    champion = client.get("/v1/models/billing/champion", headers=acme.headers).json()
    assert champion["promotion_event_id"] == moved.json()["id"]
    assert receiver.payloads()[0]["data"]["promotion_event_id"] == moved.json()["id"]  # type: ignore[index]
    assert champion["model_version_id"] == receiver.payloads()[0]["data"]["model_version_id"]  # type: ignore[index]
    assert champion["training_run_id"] is not None

    mine = client.get("/v1/models/billing/webhooks", headers=acme.headers)
    others = client.get("/v1/models/billing/webhooks", headers=globex.headers)

    assert mine.status_code == 200, mine.text
    (item,) = mine.json()["items"]
    assert item["promotion_event_id"] == moved.json()["id"]
    assert (item["event"], item["status"], item["attempts"]) == ("promoted", "delivered", 1)
    assert item["url"] == receiver.url
    assert item["body"]["tenant"] == "acme"
    (their_item,) = others.json()["items"]
    assert their_item["body"]["tenant"] == "globex"
    assert their_item["id"] != item["id"]
    leak = client.get(
        "/v1/models/billing/webhooks", params={"after": item["id"]}, headers=globex.headers
    )
    unknown = client.get(
        "/v1/models/billing/webhooks", params={"after": str(uuid.uuid4())}, headers=globex.headers
    )
    assert leak.status_code == unknown.status_code == 422  # as for an id that never existed
    assert leak.json()["error"]["message"] == f"after: no delivery {item['id']} in billing"


def test_the_listing_pages_and_filters(
    client: TestClient,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    acme = make_caller(sessions, scopes=SCOPES)
    registry = MlflowRegistry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client.app.state.registry = registry  # type: ignore[attr-defined]
    register(sessions, registry, acme, tmp_path, "one", PASSED)
    register(sessions, registry, acme, tmp_path, "two", PASSED)
    with serve_receiver() as receiver:
        configure(monkeypatch, receiver.url, receiver.url + "/second")
        for version in ("1", "2"):
            moved = client.post(
                "/v1/models/billing/promote",
                json={"version": version, "force": True},
                headers=acme.headers,
            )
            assert moved.status_code == 200, moved.text

    first = client.get("/v1/models/billing/webhooks?limit=3", headers=acme.headers).json()
    rest = client.get(
        "/v1/models/billing/webhooks",
        params={"limit": 3, "after": first["next_after"]},
        headers=acme.headers,
    ).json()
    failed = client.get("/v1/models/billing/webhooks?status=failed", headers=acme.headers)
    bad = client.get("/v1/models/billing/webhooks?status=lost", headers=acme.headers)
    reader = make_caller(sessions, tenant="initech", scopes=("feedback:write",))
    refused = client.get("/v1/models/billing/webhooks", headers=reader.headers)

    ids = [i["id"] for i in first["items"] + rest["items"]]
    assert len(ids) == len(set(ids)) == 4  # two moves, two URLs each
    assert rest["next_after"] is None
    assert [i["body"]["to_version"] for i in first["items"] + rest["items"]] == ["1", "1", "2", "2"]
    assert failed.json() == {"items": [], "next_after": None}
    assert bad.status_code == 422
    assert refused.status_code == 403

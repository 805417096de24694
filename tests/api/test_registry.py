"""The models API: list, champion, promote and roll back, with real MLflow behind it."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.models import PromotionEvent
from flywheel.registry.mlflow_registry import MlflowRegistry
from tests.conftest import make_caller
from tests.integration.test_registry import FAILED, PASSED, register

SCOPES = ("models:write", "data:read")


def test_promote_read_champion_and_roll_back(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    caller = make_caller(sessions, scopes=SCOPES)
    registry = MlflowRegistry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client.app.state.registry = registry  # type: ignore[attr-defined]
    register(sessions, registry, caller, tmp_path, "one", PASSED)
    register(sessions, registry, caller, tmp_path, "two", PASSED)

    none_yet = client.get("/v1/models/billing/champion", headers=caller.headers)
    first = client.post("/v1/models/billing/promote", json={"version": "1"}, headers=caller.headers)
    second = client.post(
        "/v1/models/billing/promote",
        json={"version": "2", "reason": "beats v1"},
        headers=caller.headers,
    )
    champion = client.get("/v1/models/billing/champion", headers=caller.headers)
    back = client.post("/v1/models/billing/rollback", json={}, headers=caller.headers)
    listed = client.get("/v1/models/billing", headers=caller.headers)

    assert none_yet.status_code == 404
    assert first.status_code == 200, first.text
    assert second.json()["from_version"] == "1"
    assert second.json()["to_version"] == "2"
    assert second.json()["actor"] == f"api-key:{caller.key_id}"
    assert champion.json() == {
        "domain": "billing",
        "registered_model": "acme.billing",
        "version": "2",
        "registry_uri": "models:/acme.billing@champion",
        "adapter_uri": champion.json()["adapter_uri"],
        "base_model": "/models/tiny",
        "model_version_id": champion.json()["model_version_id"],
        "training_run_id": champion.json()["training_run_id"],
        "promotion_event_id": second.json()["id"],
        "promoted_at": second.json()["created_at"].replace("+00:00", "Z"),
    }
    assert champion.json()["adapter_uri"].startswith("runs:/")
    assert (back.json()["action"], back.json()["to_version"]) == ("rollback", "1")
    body = listed.json()
    assert body["champion"] == "1"
    assert [v["version"] for v in body["versions"]] == ["2", "1"]
    assert [e["action"] for e in body["history"]] == ["rollback", "promote", "promote"]
    assert registry.alias_version("acme.billing", "champion") == "1"


def test_refusals_are_4xx_with_a_json_error_and_move_nothing(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    caller = make_caller(sessions, scopes=SCOPES)
    reader = make_caller(sessions, tenant="globex", scopes=("data:read",))
    registry = MlflowRegistry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client.app.state.registry = registry  # type: ignore[attr-defined]
    register(sessions, registry, caller, tmp_path, "weak", FAILED)

    gate = client.post("/v1/models/billing/promote", json={"version": "1"}, headers=caller.headers)
    unknown = client.post(
        "/v1/models/billing/promote", json={"version": "9"}, headers=caller.headers
    )
    no_previous = client.post("/v1/models/billing/rollback", json={}, headers=caller.headers)
    forbidden = client.post(
        "/v1/models/billing/promote", json={"version": "1"}, headers=reader.headers
    )
    bad_body = client.post(
        "/v1/models/billing/promote", json={"version": "1", "extra": 1}, headers=caller.headers
    )

    assert gate.status_code == 409
    assert "did not pass its gate" in gate.json()["error"]["message"]
    assert unknown.status_code == 404
    assert no_previous.status_code == 409
    assert forbidden.status_code == 403
    assert bad_body.status_code == 422
    with sessions() as session:
        assert session.scalars(select(PromotionEvent)).all() == []


def test_a_promotion_on_a_stale_verdict_is_a_409_and_moves_nothing(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    caller = make_caller(sessions, scopes=SCOPES)
    registry = MlflowRegistry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client.app.state.registry = registry  # type: ignore[attr-defined]
    register(sessions, registry, caller, tmp_path, "one", PASSED)  # passed against the base
    register(sessions, registry, caller, tmp_path, "two", PASSED)  # passed against v1
    for version in ("1", "2"):
        moved = client.post(
            "/v1/models/billing/promote", json={"version": version}, headers=caller.headers
        )
        assert moved.status_code == 200, moved.text

    back_to_one = client.post(
        "/v1/models/billing/promote", json={"version": "1"}, headers=caller.headers
    )

    assert back_to_one.status_code == 409
    assert back_to_one.json()["error"]["code"] == "conflict"
    assert "stale verdict" in back_to_one.json()["error"]["message"]
    assert registry.alias_version("acme.billing", "champion") == "2"
    with sessions() as session:
        assert len(session.scalars(select(PromotionEvent)).all()) == 2

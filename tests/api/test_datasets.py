"""GET /v1/datasets and POST /v1/datasets/{domain}/versions: built once per change, scoped,
tenant-isolated."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work
from flywheel.models import DatasetVersion, Domain
from flywheel.signals.candidates import Provenance, SftCandidate
from flywheel.signals.store import store_candidates
from tests.conftest import Caller, make_caller


def store_examples(sessions: sessionmaker[Session], caller: Caller, count: int) -> None:
    with unit_of_work(sessions) as session:
        domain_id = session.scalars(
            select(Domain.id).where(Domain.tenant_id == caller.tenant_id)
        ).one()
        store_candidates(
            session=session,
            tenant_id=caller.tenant_id,
            domain_id=domain_id,
            candidates=[
                SftCandidate(
                    Provenance("api", f"e-{n}", f"g-{n}"),
                    [{"role": "user", "content": f"question {n}"}],
                    f"answer {n}",
                )
                for n in range(count)
            ],
            ingestor_version="test",
        )


def test_build_then_nothing_new_then_list(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    builder = make_caller(sessions, scopes=("models:write", "data:read"))
    store_examples(sessions, builder, 20)

    first = client.post("/v1/datasets/billing/versions", headers=builder.headers)
    again = client.post(
        "/v1/datasets/billing/versions", json={"eval_fraction": 0.2}, headers=builder.headers
    )

    assert first.status_code == 201, first.text
    body = first.json()
    assert (body["version"], body["domain"]) == (1, "billing")
    assert body["recipe"]["eval_fraction"] == 0.1
    assert sum(body["stats"]["train"].values()) + sum(body["stats"]["eval"].values()) == 20
    assert again.status_code == 200
    assert again.json()["id"] == body["id"]
    # 20 one-item groups at a tenth in eval: short of the gate's minimum, and it says so
    assert any("eval" in warning for warning in body["warnings"]), body["warnings"]
    listed = client.get("/v1/datasets", params={"domain": "billing"}, headers=builder.headers)
    assert [item["id"] for item in listed.json()["items"]] == [body["id"]]
    with sessions() as session:
        assert session.scalars(select(DatasetVersion.version)).all() == [1]


def test_scopes_validation_and_isolation(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    other = make_caller(sessions, tenant="globex", scopes=("models:write", "data:read"))
    cases = [
        ("/v1/datasets/billing/versions", None, acme.headers, 403),  # feedback keys can't build
        ("/v1/datasets/nope/versions", None, other.headers, 404),
        ("/v1/datasets/billing/versions", {"eval_fraction": 1}, other.headers, 422),
        ("/v1/datasets/billing/versions", {"ngram": 0}, other.headers, 422),
        ("/v1/datasets/billing/versions", {"shuffle": True}, other.headers, 422),
    ]
    for path, body, headers, status in cases:
        response = client.post(path, json=body, headers=headers)
        assert response.status_code == status, (path, body, response.text)
        assert set(response.json()["error"]) >= {"code", "message"}
    store_examples(sessions, acme, 3)
    built = client.post("/v1/datasets/billing/versions", headers=other.headers)
    assert built.json()["stats"]["train"] == {}  # globex's own, empty billing domain
    theirs = client.get("/v1/datasets", params={"domain": "billing"}, headers=acme.headers)
    assert theirs.json()["items"] == []


def test_a_recipe_with_source_weights_is_recorded_and_a_bad_mix_is_a_422(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    builder = make_caller(sessions, scopes=("models:write", "data:read"))
    store_examples(sessions, builder, 5)

    bad = client.post(
        "/v1/datasets/billing/versions", json={"mix": {"support": 1.5}}, headers=builder.headers
    )
    unknown = client.post(
        "/v1/datasets/billing/versions", json={"mix": {"support": 0.5}}, headers=builder.headers
    )
    built = client.post(
        "/v1/datasets/billing/versions",
        json={"source_weights": {"ticket": 0.5}},
        headers=builder.headers,
    )

    assert bad.status_code == 422
    assert bad.json()["error"]["code"]
    assert unknown.status_code == 422
    assert "no such domain" in unknown.json()["error"]["message"]
    assert built.status_code == 201, built.text
    assert built.json()["recipe"]["source_weights"] == {"ticket": 0.5}

"""Keys: hashed, scoped, revocable; tenants never see each other's rows (404, not 403)."""

from __future__ import annotations

import hashlib

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work
from flywheel.models import ApiKey
from flywheel.tenancy import service as tenancy
from tests.conftest import RATING, Caller, count_rows, make_caller


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer not-a-key"},
        {"Authorization": "Bearer fwk_0123456789abcdef_" + "A" * 43},
    ],
    ids=["missing", "basic", "empty", "malformed", "unknown"],
)
def test_missing_or_unknown_key_is_401(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session], headers: dict[str, str]
) -> None:
    response = client.post("/v1/feedback", json=RATING, headers=headers)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert count_rows(sessions, "feedback_events") == 0


@pytest.mark.parametrize("valid_first", [True, False], ids=["valid-first", "valid-second"])
def test_two_authorization_headers_are_401(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session], valid_first: bool
) -> None:
    valid = ("Authorization", f"Bearer {acme.key}")
    other = ("Authorization", "Bearer fwk_0123456789abcdef_" + "A" * 43)
    headers = [valid, other] if valid_first else [other, valid]

    response = client.post("/v1/feedback", json=RATING, headers=headers)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"
    assert "one Authorization header" in response.json()["error"]["message"]
    assert count_rows(sessions, "feedback_events") == 0


def test_right_prefix_wrong_secret_is_401(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    forged = acme.key[:-4] + ("AAAA" if not acme.key.endswith("AAAA") else "BBBB")
    response = client.post(
        "/v1/feedback", json=RATING, headers={"Authorization": f"Bearer {forged}"}
    )

    assert response.status_code == 401
    assert count_rows(sessions, "feedback_events") == 0


def test_revoked_key_is_401(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    assert client.post("/v1/feedback", json=RATING, headers=acme.headers).status_code == 201
    with unit_of_work(sessions) as session:
        tenancy.revoke_api_key(session=session, key_id=acme.key_id)

    response = client.post("/v1/feedback", json=RATING, headers=acme.headers)

    assert response.status_code == 401
    assert count_rows(sessions, "feedback_events") == 1


def test_key_without_the_scope_is_403(client: TestClient, sessions: sessionmaker[Session]) -> None:
    reader = make_caller(sessions, scopes=("data:read",))

    response = client.post("/v1/feedback", json=RATING, headers=reader.headers)

    assert response.status_code == 403
    assert "feedback:write" in response.json()["error"]["message"]
    assert count_rows(sessions, "feedback_events") == 0


def test_writer_cannot_read_and_admin_can(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    writer = make_caller(sessions, scopes=("feedback:write",))
    created = client.post(
        "/v1/interactions",
        json={"domain": "billing", "prompt": "p", "response": "r"},
        headers=writer.headers,
    ).json()
    with unit_of_work(sessions) as session:
        owner = tenancy.get_tenant(session=session, name="acme")
        admin = tenancy.create_api_key(session=session, tenant=owner, scopes=("admin",)).secret

    assert (
        client.get(f"/v1/interactions/{created['id']}", headers=writer.headers).status_code == 403
    )
    as_admin = client.get(
        f"/v1/interactions/{created['id']}", headers={"Authorization": f"Bearer {admin}"}
    )
    assert as_admin.status_code == 200


def test_keys_are_stored_only_as_hashes(acme: Caller, sessions: sessionmaker[Session]) -> None:
    prefix, secret = tenancy.split_key(acme.key) or ("", "")
    with sessions() as session:
        row = session.scalars(select(ApiKey)).one()
    assert row.prefix == prefix
    assert row.secret_sha256 == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in (row.secret_sha256, row.prefix, row.name)
    assert len(secret) >= 43  # 32 random bytes


def test_other_tenants_interaction_is_404(
    client: TestClient, acme: Caller, globex: Caller, sessions: sessionmaker[Session]
) -> None:
    theirs = client.post(
        "/v1/interactions",
        json={"domain": "billing", "prompt": "p", "response": "r"},
        headers=globex.headers,
    ).json()["id"]

    read = client.get(f"/v1/interactions/{theirs}", headers=acme.headers)
    rate = client.post(
        "/v1/feedback",
        json={"interaction_id": theirs, "kind": "rating", "value": {"thumbs": "down"}},
        headers=acme.headers,
    )
    batch = client.post(
        "/v1/feedback/batch",
        json={
            "events": [{"interaction_id": theirs, "kind": "rating", "value": {"thumbs": "down"}}]
        },
        headers=acme.headers,
    )

    assert (read.status_code, rate.status_code, batch.status_code) == (404, 404, 422)
    assert batch.json()["error"]["details"][0]["code"] == "not_found"
    assert count_rows(sessions, "feedback_events") == 0
    assert client.get(f"/v1/interactions/{theirs}", headers=globex.headers).status_code == 200


def test_same_domain_name_in_two_tenants_stays_apart(
    client: TestClient, acme: Caller, globex: Caller, sessions: sessionmaker[Session]
) -> None:
    client.post("/v1/feedback", json=RATING, headers=acme.headers)
    client.post("/v1/feedback", json=RATING, headers=globex.headers)

    from flywheel.models import FeedbackEvent

    with sessions() as session:
        tenants = sorted(str(row.tenant_id) for row in session.scalars(select(FeedbackEvent)))
    assert tenants == sorted([str(acme.tenant_id), str(globex.tenant_id)])

"""GET /v1/preference-pairs, GET|POST /v1/tasks: paged, tenant-isolated, never leaking the
hidden tests, and a task stored once however often it is posted."""

from __future__ import annotations

import re
import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work
from flywheel.models import Domain, VerifiableTask
from flywheel.signals.candidates import PairCandidate, Provenance
from flywheel.signals.store import store_candidates
from flywheel.signals.verification import check_spec, task_spec
from tests.conftest import Caller, count_rows, make_caller

TASK = {
    "domain": "billing",
    "task_id": "acme-42",
    "prompt": 'def add(a, b):\n    """Sum of a and b."""\n',
    "entry_point": "add",
    "reference_solution": 'def add(a, b):\n    """Sum of a and b."""\n    return a + b\n',
    "hidden_tests": "def test_add():\n    assert add(2, 3) == 5\n",
}


def test_a_task_is_stored_once_and_read_without_its_secrets(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    first = client.post("/v1/tasks", json=TASK, headers=acme.headers)
    again = client.post("/v1/tasks", json={**TASK, "task_id": "other"}, headers=acme.headers)

    assert first.status_code == 201, first.text
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    body = first.json()
    assert body["verifier_status"] == "pending"
    assert (body["kind"], body["source_kind"], body["source_ref"]) == ("code", "api", "acme-42")
    assert "hidden_tests" not in body
    assert "reference_solution" not in body
    with sessions() as session:
        row = session.scalars(select(VerifiableTask)).one()
    assert row.hidden_tests == TASK["hidden_tests"]
    assert row.reference_solution == TASK["reference_solution"]
    assert row.tenant_id == acme.tenant_id

    listed = client.get("/v1/tasks", params={"domain": "billing"}, headers=acme.headers)
    assert listed.status_code == 200
    assert [task["id"] for task in listed.json()["items"]] == [body["id"]]
    assert "return a + b" not in listed.text


def test_task_validation_and_isolation(
    client: TestClient, acme: Caller, globex: Caller, sessions: sessionmaker[Session]
) -> None:
    no_tests = {key: value for key, value in TASK.items() if key != "hidden_tests"}
    cases = [
        (no_tests, acme.headers, 422),
        ({**TASK, "kind": "answer"}, acme.headers, 422),  # an answer task needs an answer
        ({**TASK, "domain": "nope"}, acme.headers, 404),
        ({**TASK, "surprise": 1}, acme.headers, 422),
    ]
    for payload, headers, status in cases:
        response = client.post("/v1/tasks", json=payload, headers=headers)
        assert response.status_code == status, (payload, response.text)
        assert set(response.json()["error"]) >= {"code", "message"}
    reader = make_caller(sessions, tenant="initech", scopes=("data:read",))
    response = client.post("/v1/tasks", json=TASK, headers=reader.headers)
    assert response.status_code == 403
    assert count_rows(sessions, "verifiable_tasks") == 0

    assert client.post("/v1/tasks", json=TASK, headers=acme.headers).status_code == 201
    theirs = client.get("/v1/tasks", params={"domain": "billing"}, headers=globex.headers)
    assert theirs.json()["items"] == []  # globex's own billing domain is empty


def store_pairs(sessions: sessionmaker[Session], caller: Caller, count: int) -> None:
    with unit_of_work(sessions) as session:
        domain_id = session.scalars(
            select(Domain.id).where(Domain.tenant_id == caller.tenant_id)
        ).one()
        store_candidates(
            session=session,
            tenant_id=caller.tenant_id,
            domain_id=domain_id,
            candidates=[
                PairCandidate(
                    Provenance("feedback", f"e-{number}", group_key=f"g-{number}"),
                    messages=[{"role": "user", "content": f"question {number}"}],
                    chosen="good",
                    rejected="bad",
                    why="comparison",
                    weight=0.5,
                )
                for number in range(count)
            ],
            ingestor_version="test",
        )


def test_preference_pairs_page_through_in_id_order(
    client: TestClient, acme: Caller, globex: Caller, sessions: sessionmaker[Session]
) -> None:
    store_pairs(sessions, acme, 5)

    seen: list[str] = []
    after: str | None = None
    for _ in range(3):
        params = {"domain": "billing", "limit": 2} | ({"after": after} if after else {})
        page = client.get("/v1/preference-pairs", params=params, headers=acme.headers).json()
        seen += [item["id"] for item in page["items"]]
        after = page["next_after"]
    assert after is None
    assert seen == sorted(seen, key=uuid.UUID)
    assert len(set(seen)) == 5
    first = client.get("/v1/preference-pairs", params={"domain": "billing"}, headers=acme.headers)
    item = first.json()["items"][0]
    assert (item["chosen"], item["rejected"], item["why"], item["weight"]) == (
        "good",
        "bad",
        "comparison",
        0.5,
    )

    theirs = client.get(
        "/v1/preference-pairs", params={"domain": "billing"}, headers=globex.headers
    )
    assert theirs.json() == {"items": [], "next_after": None}
    missing = client.get("/v1/preference-pairs", params={"domain": "x"}, headers=acme.headers)
    assert missing.status_code == 404
    bad = client.get(
        "/v1/preference-pairs", params={"domain": "billing", "limit": 0}, headers=acme.headers
    )
    assert bad.status_code == 422


def test_a_posted_task_is_redacted_before_it_is_stored(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    secret = "AKIA" + "IOSFODNN7EXAMPLQ"
    prompt = f'def mail():\n    """Write to ops@acme.example with key {secret}."""\n'
    payload = {**TASK, "prompt": prompt, "reference_solution": prompt + "    return 1\n"}

    response = client.post("/v1/tasks", json=payload, headers=acme.headers)

    assert response.status_code == 201, response.text
    assert "ops@acme.example" not in response.text
    with sessions() as session:
        row = session.scalars(select(VerifiableTask)).one()
    assert re.search(r"@(mail\.)?example\.", row.prompt)  # a surrogate address
    assert "<EMAIL>" not in row.prompt
    assert secret not in row.prompt
    assert row.redaction_report["EMAIL"] == 2  # prompt and reference


def test_a_domain_query_with_a_nul_byte_is_refused_not_a_500(
    client: TestClient, acme: Caller
) -> None:
    for path in ("/v1/tasks", "/v1/preference-pairs", "/v1/datasets"):
        response = client.get(path, params={"domain": "bil\x00ling"}, headers=acme.headers)
        assert response.status_code == 422, (path, response.text)
        assert response.json()["error"]["code"]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOL_TASK = {
    "domain": "billing",
    "kind": "tool_call",
    "task_id": "weather-1",
    "prompt": "What is the weather in Paris?",
    "tools": [WEATHER],
    "expected_calls": [{"name": "get_weather", "arguments": {"city": ["Paris"], "unit": [""]}}],
}
COUNTER = """
class Counter:
    def __init__(self):
        self.count = 0

    def add(self, amount: int) -> int:
        self.count += amount
        return self.count
"""
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"amount": {"type": "integer"}}},
    },
}
ENVIRONMENT_TASK = {
    "domain": "billing",
    "kind": "environment",
    "task_id": "counter-1",
    "prompt": "Add 3 to the counter.",
    "tools": [ADD],
    "environment": {
        "source": COUNTER,
        "classes": {"Counter": {}},
        "ground_truth": [[{"name": "add", "arguments": {"amount": 3}}]],
    },
}


def test_a_tool_call_task_is_posted_read_without_its_answer_and_passes_qa(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    response = client.post("/v1/tasks", json=TOOL_TASK, headers=acme.headers)

    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["kind"], body["tools"]) == ("tool_call", [WEATHER])
    assert "expected_calls" not in body
    listed = client.get("/v1/tasks", params={"domain": "billing"}, headers=acme.headers)
    assert [task["id"] for task in listed.json()["items"]] == [body["id"]]
    assert 'Paris"]' not in listed.text  # the expected arguments never leave
    with sessions() as session:
        row = session.scalars(select(VerifiableTask)).one()
        result = check_spec(task_spec(row))
    assert row.expected_calls == TOOL_TASK["expected_calls"]
    assert row.tools == [WEATHER]
    assert result.status == "usable", result.reason


def test_an_environment_task_is_posted_and_read_without_its_environment(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    response = client.post("/v1/tasks", json=ENVIRONMENT_TASK, headers=acme.headers)

    assert response.status_code == 201, response.text
    assert "environment" not in response.json()
    assert "ground_truth" not in response.text
    with sessions() as session:
        row = session.scalars(select(VerifiableTask)).one()
    assert row.task_kind == "environment"
    assert row.environment is not None
    assert row.environment["ground_truth"] == ENVIRONMENT_TASK["environment"]["ground_truth"]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"expected_calls": None}, "expected_calls"),
        ({"tools": None}, "tools"),
        ({"expected_calls": [{"name": "get_time", "arguments": {}}]}, "get_time"),
        ({"expected_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}, "city"),
        ({"kind": "code", "entry_point": "f", "hidden_tests": "assert True"}, "expected_calls"),
        ({"environment": ENVIRONMENT_TASK["environment"]}, "environment"),
    ],
)
def test_a_tool_call_task_that_cannot_be_checked_is_a_422(
    client: TestClient,
    acme: Caller,
    sessions: sessionmaker[Session],
    change: dict[str, object],
    says: str,
) -> None:
    payload = {key: value for key, value in {**TOOL_TASK, **change}.items() if value is not None}

    response = client.post("/v1/tasks", json=payload, headers=acme.headers)

    assert response.status_code == 422, response.text
    assert says in response.json()["error"]["message"], response.text
    assert count_rows(sessions, "verifiable_tasks") == 0


@pytest.mark.parametrize(
    ("environment", "says"),
    [
        (None, "needs 'environment'"),
        ({"source": COUNTER, "classes": {"Counter": {}}}, "ground_truth"),
        ({"source": 3, "classes": {}, "ground_truth": []}, "source"),
        (
            {"source": COUNTER, "classes": {"Counter": {}}, "ground_truth": [[]], "max_steps": 0},
            "max_steps",
        ),
        ({"source": COUNTER, "classes": {}, "ground_truth": [[{"arguments": {}}]]}, "name"),
    ],
)
def test_an_environment_task_that_cannot_be_run_is_a_422(
    client: TestClient,
    acme: Caller,
    sessions: sessionmaker[Session],
    environment: dict[str, object] | None,
    says: str,
) -> None:
    payload = {**ENVIRONMENT_TASK, "environment": environment}
    if environment is None:
        del payload["environment"]

    response = client.post("/v1/tasks", json=payload, headers=acme.headers)

    assert response.status_code == 422, response.text
    assert says in response.json()["error"]["message"], response.text
    assert count_rows(sessions, "verifiable_tasks") == 0

"""Bad bodies get a clear 4xx with the JSON error body, and the database stays unchanged."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from api.app import create_app
from flywheel.settings import Settings
from tests.conftest import Caller, count_rows, make_caller

JSON = {"Content-Type": "application/json"}


def post_raw(
    client: TestClient, caller: Caller, body: bytes, path: str = "/v1/feedback"
) -> httpx.Response:
    return client.post(path, content=body, headers={**caller.headers, **JSON})


def assert_rejected(
    response: httpx.Response, status: int, sessions: sessionmaker[Session]
) -> dict[str, str]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"]
    assert error["message"]
    assert count_rows(sessions, "feedback_events") == 0
    assert count_rows(sessions, "interactions") == 0
    return dict(error)


@pytest.mark.parametrize(
    "body",
    [b'{"domain": "billing",', b"[1, 2", b"", b"null", b"42", b'"text"', b"{'single': 'quotes'}"],
)
def test_malformed_json_is_422(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session], body: bytes
) -> None:
    assert_rejected(post_raw(client, acme, body), 422, sessions)


@pytest.mark.parametrize(
    "text",
    ["nul\\u0000byte", "lone \\ud800 surrogate", "low \\udc00 surrogate"],
)
@pytest.mark.parametrize("field", ["prompt", "response", "rater"])
def test_nul_bytes_and_lone_surrogates_are_422(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session], text: str, field: str
) -> None:
    fields = {"prompt": "p", "response": "r", "rater": "u-1", field: "__TEXT__"}
    payload = {"domain": "billing", "kind": "rating", "value": {"stars": 3}, **fields}
    body = json.dumps(payload).replace("__TEXT__", text).encode()

    assert_rejected(post_raw(client, acme, body), 422, sessions)


def test_nul_in_metadata_key_is_422(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    body = b'{"domain": "billing", "prompt": "p", "response": "r", "metadata": {"k\\u0000": 1}}'

    assert_rejected(post_raw(client, acme, body, "/v1/interactions"), 422, sessions)


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-9223372036854775809", b"1e999"])
def test_unportable_numbers_in_metadata_are_422(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session], number: bytes
) -> None:
    body = (
        b'{"domain": "billing", "prompt": "p", "response": "r", "metadata": {"n": ' + number + b"}}"
    )

    assert_rejected(post_raw(client, acme, body, "/v1/interactions"), 422, sessions)


def test_wrong_types_are_422(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    payload = {"domain": 42, "prompt": ["not", "text"], "response": None}
    error = assert_rejected(
        client.post("/v1/interactions", json=payload, headers=acme.headers), 422, sessions
    )
    assert error["code"] == "invalid_input"


def test_unknown_fields_cannot_set_tenant_or_internal_flags(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    payload = {
        "domain": "billing",
        "prompt": "p",
        "response": "r",
        "tenant_id": "00000000-0000-4000-8000-000000000000",
    }
    response = client.post("/v1/interactions", json=payload, headers=acme.headers)

    error = assert_rejected(response, 422, sessions)
    assert "tenant_id" in error["message"]


def test_text_over_the_length_cap_is_422(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    payload = {"domain": "billing", "prompt": "p", "response": "x" * 200_001}
    assert_rejected(
        client.post("/v1/interactions", json=payload, headers=acme.headers), 422, sessions
    )


def test_body_over_the_cap_is_413(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    payload = {"domain": "billing", "prompt": "p", "response": "x" * (1024 * 1024)}
    error = assert_rejected(
        client.post("/v1/interactions", json=payload, headers=acme.headers), 413, sessions
    )
    assert error["code"] == "payload_too_large"


def test_body_lying_about_its_length_is_413_without_being_read_whole(
    settings: Settings, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    """A body longer than its Content-Length claims is cut off once it passes the cap."""
    app = create_app(settings.model_copy(update={"max_body_bytes": 4096}), sessions=sessions)
    chunks_read = 0
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        nonlocal chunks_read
        chunks_read += 1
        return {"type": "http.request", "body": b"x" * 1024, "more_body": chunks_read < 10_000}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/interactions",
        "raw_path": b"/v1/interactions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"content-type", b"application/json"),
            (b"content-length", b"100"),  # the lie: 10 MB follow
            (b"authorization", f"Bearer {acme.key}".encode()),
        ],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
        "state": {},
    }
    anyio.run(app, scope, receive, send)

    start = next(message for message in sent if message["type"] == "http.response.start")
    body = b"".join(m["body"] for m in sent if m["type"] == "http.response.body")  # type: ignore[misc]
    assert start["status"] == 413
    assert json.loads(body)["error"]["code"] == "payload_too_large"
    assert chunks_read <= 5  # 4 KiB cap: stopped after the fifth 1 KiB chunk
    assert count_rows(sessions, "interactions") == 0


def test_declared_content_length_over_the_cap_is_413(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    headers = {**acme.headers, **JSON, "Content-Length": str(50 * 1024 * 1024)}
    response = client.post("/v1/feedback", content=b"{}", headers=headers)

    assert_rejected(response, 413, sessions)


def test_non_json_content_type_is_415(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    response = client.post(
        "/v1/feedback",
        content=b"kind=rating",
        headers={**acme.headers, "Content-Type": "text/plain"},
    )
    error = assert_rejected(response, 415, sessions)
    assert "application/json" in error["message"]


def test_unknown_route_and_method_are_json_errors(client: TestClient, acme: Caller) -> None:
    missing = client.get("/v1/nothing-here", headers=acme.headers)
    wrong_method = client.delete("/v1/feedback", headers=acme.headers)

    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    assert (wrong_method.status_code, wrong_method.json()["error"]["code"]) == (
        405,
        "method_not_allowed",
    )


def test_malformed_interaction_id_in_path_is_422(client: TestClient, acme: Caller) -> None:
    response = client.get("/v1/interactions/not-a-uuid", headers=acme.headers)

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_input"


RELEASER = ("models:write", "data:read")


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/v1/models/billing/promote", '{"version": "1\\u0000"}'),
        ("/v1/models/billing/promote", '{"version": "1", "reason": "nul \\u0000"}'),
        ("/v1/models/billing/promote", '{"version": "\\ud800"}'),
        ("/v1/models/billing/rollback", '{"to": "1\\u0000"}'),
        ("/v1/models/billing/rollback", '{"reason": "lone \\udc00"}'),
    ],
)
def test_nul_and_surrogates_in_promote_and_rollback_are_422(
    client: TestClient, sessions: sessionmaker[Session], path: str, payload: str
) -> None:
    """Schemathesis found a plain-text 500 for a NUL byte in the promoted `version`."""
    caller = make_caller(sessions, scopes=RELEASER)
    response = post_raw(client, caller, payload.encode(), path)

    error = assert_rejected(response, 422, sessions)
    assert error["code"] == "invalid_input"
    assert count_rows(sessions, "promotion_events") == 0


@pytest.mark.parametrize("value", ['"yes"', '"true"', "1", '"1"'])
def test_force_must_be_a_json_boolean(
    client: TestClient, sessions: sessionmaker[Session], value: str
) -> None:
    caller = make_caller(sessions, scopes=RELEASER)
    body = b'{"version": "1", "force": ' + value.encode() + b"}"

    error = assert_rejected(
        post_raw(client, caller, body, "/v1/models/billing/promote"), 422, sessions
    )
    assert "force" in error["message"]


def test_recipe_numbers_must_be_json_numbers(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    caller = make_caller(sessions, scopes=RELEASER)
    body = b'{"ngram": "13", "eval_fraction": "0.1"}'

    response = post_raw(client, caller, body, "/v1/datasets/billing/versions")

    assert_rejected(response, 422, sessions)
    assert count_rows(sessions, "dataset_versions") == 0


def test_invalid_utf8_is_422_like_any_invalid_body(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    body = (
        b'{"domain": "billing", "kind": "rating", "prompt": "caf\xe9", '
        b'"response": "r", "value": {"stars": 3}}'
    )
    error = assert_rejected(post_raw(client, acme, body), 422, sessions)

    assert error["code"] == "invalid_input"
    assert "UTF-8" in error["message"]


@pytest.mark.parametrize("depth", [5_000, 100_000])
def test_deeply_nested_body_is_422(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session], depth: int
) -> None:
    nested = b"[" * depth + b"]" * depth
    body = b'{"domain": "billing", "prompt": "p", "response": "r", "metadata": {"n": ' + nested
    body += b"}}"

    error = assert_rejected(post_raw(client, acme, body, "/v1/interactions"), 422, sessions)
    assert error["code"] == "invalid_input"


@pytest.mark.parametrize("path", ["/v1/feedback", "/v1/interactions"])
def test_integer_too_large_to_parse_is_422(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session], path: str
) -> None:
    huge = b"9" * 5_000  # past Python's 4,300-digit limit on int parsing
    if path == "/v1/feedback":
        body = b'{"domain": "billing", "kind": "rating", "prompt": "p", "response": "r", '
        body += b'"value": {"stars": ' + huge + b"}}"
    else:
        body = b'{"domain": "billing", "prompt": "p", "response": "r", "metadata": {"n": '
        body += huge + b"}}"

    error = assert_rejected(post_raw(client, acme, body, path), 422, sessions)
    assert error["code"] == "invalid_input"
    assert "integer" in error["message"]


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(path, value) of every scalar in a JSON value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    else:
        yield path, value


def _is_acceptable_value(path: tuple[Any, ...]) -> bool:
    """A tool_call task's acceptable argument value: any JSON value (BFCL's answers give a
    string for a number where the question names a variable), typed by the tool, not the API."""
    return path[:1] == ("expected_calls",) and "arguments" in path


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    copy = json.loads(json.dumps(value))
    parent = copy
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = new
    return copy


def _hostile(leaf: Any, *, is_data: bool = False) -> list[Any]:
    """Values of the wrong kind for a leaf: text with a NUL or a lone surrogate for a string;
    a string for a boolean or a number (strict: "yes" is not true, "5" is not 5), unless the
    leaf is data of any JSON type (`is_data`)."""
    if isinstance(leaf, str):
        return [f"{leaf}\x00", f"{leaf}\ud800"]
    if is_data:
        return []
    if isinstance(leaf, bool):
        return ["yes", "true", 1]
    if isinstance(leaf, int | float):
        return [str(leaf)]
    return []


def _example_bodies() -> list[Any]:
    """(method, path, example name, body) of every request body example in the API's schema."""
    document = create_app(Settings(home=Path(".flywheel"))).openapi()
    found = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            content = operation.get("requestBody", {}).get("content", {})
            for name, example in content.get("application/json", {}).get("examples", {}).items():
                case = (method.upper(), path, name, example["value"])
                found.append(pytest.param(*case, id=f"{method.upper()} {path} {name}"))
    return found


PATH_VALUES = {"{domain}": "billing", "{run_id}": str(uuid.uuid4())}


@pytest.mark.parametrize(("method", "path", "name", "body"), _example_bodies())
def test_every_field_of_every_body_refuses_nul_surrogates_and_loose_types(
    client: TestClient,
    sessions: sessionmaker[Session],
    method: str,
    path: str,
    name: str,
    body: Any,
) -> None:
    """Each request example's fields, one at a time, with a hostile value: always a 422."""
    caller = make_caller(sessions, scopes=("admin",))
    url = path
    for template, value in PATH_VALUES.items():
        url = url.replace(template, value)
    sent = 0
    for leaf_path, leaf in _leaves(body):
        for value in _hostile(leaf, is_data=_is_acceptable_value(leaf_path)):
            payload = json.dumps(_replaced(body, leaf_path, value)).encode()
            response = client.request(
                method, url, content=payload, headers={**caller.headers, **JSON}
            )
            assert response.status_code == 422, (name, leaf_path, value, response.text)
            assert response.json()["error"]["code"] == "invalid_input"
            sent += 1
    assert sent > 0 or body == {}
    assert count_rows(sessions, "interactions") == 0
    assert count_rows(sessions, "feedback_events") == 0


def _text_parameters() -> list[Any]:
    """(method, url) for each string path or query parameter of every operation (UUIDs aside),
    that parameter holding a NUL byte and every other one a valid value."""
    document = create_app(Settings(home=Path(".flywheel"))).openapi()
    found = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            parameters = [p for p in operation.get("parameters", []) if p["in"] != "header"]
            for target in parameters:
                if not _is_text(target["schema"]):
                    continue
                url = _url(path, parameters, target)
                found.append(pytest.param(method.upper(), url, id=f"{method.upper()} {url}"))
    return found


def _is_text(schema: dict[str, Any]) -> bool:
    branches = schema.get("anyOf", [schema])
    return any(b.get("type") == "string" and b.get("format") != "uuid" for b in branches)


def _url(path: str, parameters: list[dict[str, Any]], target: dict[str, Any]) -> str:
    valid = {"domain": "billing", "run_id": str(uuid.uuid4()), "status": None}
    query = []
    for parameter in parameters:
        value = "bil%00ling" if parameter is target else valid.get(parameter["name"])
        if parameter["in"] == "path":
            path = path.replace("{" + parameter["name"] + "}", str(value))
        elif value is not None and (parameter is target or parameter.get("required")):
            query.append(f"{parameter['name']}={value}")
    return path + ("?" + "&".join(query) if query else "")


TEXT_PARAMETERS = _text_parameters()


def test_every_text_parameter_is_swept() -> None:
    urls = {param.values[1] for param in TEXT_PARAMETERS}
    assert "/v1/models/bil%00ling/promote" in urls
    assert "/v1/datasets?domain=bil%00ling" in urls
    assert "/v1/runs?status=bil%00ling" in urls


@pytest.mark.parametrize(("method", "url"), TEXT_PARAMETERS)
def test_nul_in_path_and_query_parameters_is_422(
    client: TestClient, sessions: sessionmaker[Session], method: str, url: str
) -> None:
    caller = make_caller(sessions, scopes=("admin",))
    response = client.request(method, url, headers={**caller.headers, **JSON}, content=b"{}")

    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_input"

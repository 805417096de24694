"""The docs work offline and say how to authenticate: /docs and /redoc load only assets the app
serves itself, and the OpenAPI document has a bearer scheme, descriptions and examples."""

from __future__ import annotations

import re
import typing
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import TypeAdapter

from api import datasets, feedback, health, registry, runs, signals
from api.app import create_app
from flywheel.settings import Settings

pytestmark = pytest.mark.no_database

ASSET_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png"}


@pytest.fixture(scope="module")
def docs_client(tmp_path_factory: pytest.TempPathFactory) -> typing.Iterator[TestClient]:
    settings = Settings(home=tmp_path_factory.mktemp("docs"))
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture(scope="module")
def document(docs_client: TestClient) -> dict[str, Any]:
    response = docs_client.get("/openapi.json")
    assert response.status_code == 200
    found: dict[str, Any] = response.json()
    return found


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
    ]


def asset_urls(html: str) -> list[str]:
    """Every URL the page loads or points at: src= and href= attributes, and the spec URL."""
    urls = re.findall(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']""", html)
    urls += re.findall(r"""\burl:\s*["']([^"']+)["']""", html)
    return urls


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_same_origin_assets(docs_client: TestClient, page: str) -> None:
    response = docs_client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    urls = asset_urls(response.text)

    assert "/openapi.json" in urls
    assets = [url for url in urls if url != "/openapi.json"]
    assert any(url.endswith(".js") for url in assets), urls
    for url in urls:
        assert url.startswith("/"), f"{page} loads {url}"
        assert not url.startswith("//"), f"{page} loads {url}"
    assert "http://" not in response.text
    assert "https://" not in response.text


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_assets_are_served_with_their_content_types(
    docs_client: TestClient, page: str
) -> None:
    urls = [url for url in asset_urls(docs_client.get(page).text) if url != "/openapi.json"]

    for url in urls:
        response = docs_client.get(url)
        assert response.status_code == 200, url
        expected = next(kind for suffix, kind in ASSET_TYPES.items() if url.endswith(suffix))
        assert expected in response.headers["content-type"], (url, response.headers)
        assert len(response.content) > 1000, url


def test_swagger_ui_page_loads_the_bundle_and_its_stylesheet(docs_client: TestClient) -> None:
    urls = asset_urls(docs_client.get("/docs").text)

    assert any(url.endswith("/swagger-ui-bundle.js") for url in urls)
    assert any(url.endswith("/swagger-ui.css") for url in urls)
    bundle = docs_client.get(next(url for url in urls if url.endswith(".js")))
    assert b"SwaggerUIBundle" in bundle.content


def test_redoc_page_loads_the_standalone_bundle(docs_client: TestClient) -> None:
    urls = asset_urls(docs_client.get("/redoc").text)

    script = next(url for url in urls if url.endswith("/redoc.standalone.js"))
    assert b"Redoc" in docs_client.get(script).content


def test_the_document_has_a_bearer_scheme_that_every_v1_operation_requires(
    document: dict[str, Any],
) -> None:
    schemes = document["components"]["securitySchemes"]
    bearer = [name for name, scheme in schemes.items() if scheme.get("scheme") == "bearer"]
    assert bearer
    assert schemes[bearer[0]]["type"] == "http"
    assert "Authorization: Bearer" in document["info"]["description"]

    for method, path, operation in operations(document):
        required = {name for item in operation.get("security", []) for name in item}
        if path.startswith("/v1/"):
            assert bearer[0] in required, f"{method} {path} does not reference the bearer scheme"
            assert {"401", "403"} <= set(operation["responses"]), f"{method} {path}"
        else:
            assert not required, f"{method} {path} needs no key"


def test_every_operation_has_a_summary_and_a_description(document: dict[str, Any]) -> None:
    for method, path, operation in operations(document):
        assert operation.get("summary"), f"{method} {path}"
        assert len(operation.get("description", "")) >= 30, f"{method} {path}"


def test_every_request_body_has_examples_that_validate(docs_client: TestClient) -> None:
    document = docs_client.get("/openapi.json").json()
    routes = {
        (method, route.path): route
        for module in (datasets, feedback, health, registry, runs, signals)
        for route in module.router.routes
        if isinstance(route, APIRoute)
        for method in route.methods or ()
    }
    with_body = [item for item in operations(document) if "requestBody" in item[2]]
    assert len(with_body) >= 8

    for method, path, operation in with_body:
        examples = operation["requestBody"]["content"]["application/json"].get("examples")
        assert examples, f"{method} {path} has no request example"
        body_type = typing.get_type_hints(routes[method, path].endpoint, include_extras=True)
        adapter: TypeAdapter[Any] = TypeAdapter(body_type["body"])
        for name, example in examples.items():
            assert adapter.validate_python(example["value"]), f"{method} {path} example {name}"


def test_error_statuses_and_input_rules_are_documented(document: dict[str, Any]) -> None:
    description = document["info"]["description"]
    for rule in ("NUL", "surrogate", "UTF-8", "4,300", '"yes"'):
        assert rule in description, rule
    for method, path, operation in operations(document):
        if "requestBody" in operation:
            for status in ("413", "415", "422"):
                assert status in operation["responses"], f"{method} {path} {status}"
        for status, response in operation["responses"].items():
            assert response.get("description"), f"{method} {path} {status}"

"""What the OpenAPI document says beyond the handlers: how to authenticate, the error responses
each operation can give, request examples; and the docs pages, served with their own assets.

Swagger UI and ReDoc come from the `fastapi-offline` distribution (its `static/` folder holds
`swagger-ui-bundle.js`, `swagger-ui.css` and `redoc.standalone.js`), mounted here, so `/docs`
and `/redoc` work with no network: nothing on either page is loaded from another origin.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPBearer
from fastapi.staticfiles import StaticFiles

from api.schemas import ErrorBody

DOCS_ASSETS_URL = "/docs-assets"
DOCS_ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))

SUMMARY = "Send interactions and feedback; Flywheel turns them into better models."

AUTHENTICATION = """\
## Authentication

Every `/v1` operation needs an API key, sent as `Authorization: Bearer <key>`. An operator
creates one with `flywheel keys create --tenant <tenant> --scopes <scopes>`; the key
(`fwk_<16 hex>_<43 characters>`) is printed once and only its hash is stored. Scopes:
`feedback:write` (record interactions, feedback and tasks), `data:read` (read them, datasets,
runs and models), `models:write` (build datasets, queue runs, promote and roll back), `admin`
(all of them). A missing or unknown key is a 401, a key without the scope a 403, and a key over
its rate limit a 429 with `Retry-After`. In Swagger UI, press **Authorize** and paste the key.
"""

INPUT_RULES = """\
## Input rules

Bodies are JSON (`Content-Type: application/json`, else 415), at most the configured size (else
413). Unknown fields are refused. Numbers and booleans are JSON numbers and booleans: `"5"` is
not 5 and `"yes"` is not `true`. No string may hold a NUL byte or a lone UTF-16 surrogate, and
every string has a length limit. Metadata nests at most 8 levels, its integers fit in 64 bits
and its numbers are finite. A body that is not valid UTF-8, nests past the parser's limit or
holds an integer of more than 4,300 digits is refused like malformed JSON. All of these are a
422 with the error body `{"error": {"code": "invalid_input", "message", "details"}}`.
"""

DESCRIPTION = f"{SUMMARY}\n\n{AUTHENTICATION}\n{INPUT_RULES}"
"""The document's description: what the API is for, how to authenticate, what it refuses."""

BEARER = HTTPBearer(
    scheme_name="bearerAuth",
    bearerFormat="fwk_<prefix>_<secret>",
    description="A Flywheel API key: `Authorization: Bearer <key>`.",
    auto_error=False,
)
"""The scheme the document declares. `api.auth.require` checks the header itself: as a
dependency of every route, this would parse the header once more per request for nothing
(about 12 us of CPU, measured with a bare route), so the document gets it from
`install_security` instead."""

ERROR_DESCRIPTIONS = {
    401: "No API key, a malformed one, or an unknown or revoked one.",
    403: "The API key lacks the scope this operation needs.",
    404: "Not found: no such domain, interaction, run or version for this tenant.",
    409: "The request conflicts with the current state (see the message).",
    413: "The request body is over the size cap.",
    415: "The request body is not declared as `application/json`.",
    422: (
        "Invalid input: a field fails its type, range, length or cross-field rule, or holds a "
        "NUL byte or a lone surrogate; or the body is not JSON, not UTF-8, nests too deeply, "
        "or holds an integer of more than 4,300 digits."
    ),
    429: (
        "Over the API key's rate limit, or the client address's budget of failed requests: "
        "retry after `Retry-After` seconds."
    ),
    503: (
        "A service this operation needs (the model registry, the database, or the shared "
        "limit store when `FLYWHEEL_REDIS_URL` is set) is unavailable."
    ),
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` entries of these error statuses, each with the one error body."""
    return {
        status: {"model": ErrorBody, "description": ERROR_DESCRIPTIONS[status]}
        for status in statuses
    }


READ_ERRORS = errors(401, 403, 404, 409, 413, 422, 429, 503)
"""What any authenticated operation can answer (409 on a concurrent change of state, 503
when the shared limit store is configured and unreachable)."""
WRITE_ERRORS = {**READ_ERRORS, **errors(415)}
"""What an operation that takes a body can answer besides."""


def install_security(app: FastAPI, *, path_prefix: str = "/v1/") -> None:
    """Declare the bearer scheme, required by every operation under `path_prefix` (each
    checks the key with `api.auth.require`), in the app's OpenAPI document."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        schemes = document.setdefault("components", {}).setdefault("securitySchemes", {})
        schemes[BEARER.scheme_name] = BEARER.model.model_dump(
            mode="json", by_alias=True, exclude_none=True
        )
        for path, operations in document.get("paths", {}).items():
            if path.startswith(path_prefix):
                for operation in operations.values():
                    operation["security"] = [{BEARER.scheme_name: []}]
        app.openapi_schema = document
        return document

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override


def install_docs(app: FastAPI) -> None:
    """Serve Swagger UI at /docs and ReDoc at /redoc, with their assets from this app."""
    app.mount(DOCS_ASSETS_URL, StaticFiles(directory=DOCS_ASSETS_DIR), name="docs-assets")
    title = app.title

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png",
            # No badge from the public validator: the page makes no request to another origin.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{title} - ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )

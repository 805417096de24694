"""`create_gateway_app(settings)`: the OpenAI-compatible gateway, its own server process.

The official `openai` client works against it with base URL `http://HOST:PORT/v1` and a
Flywheel API key with the `infer` scope:

    POST /v1/chat/completions   `model` = a domain (`billing`, `billing@challenger`, `billing:3`)
    GET  /v1/models             the tenant's domains (and `<domain>@challenger` where one exists)
    GET  /healthz, /readyz, /metrics

Auth, rate limits, the body cap and the request metrics are the REST API's own
(`api.auth`, `api.middleware`, `api.health`); errors come in OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`, so the client raises its usual exceptions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as AsgiScope

import flywheel
from api import health
from api.app import _freeze_startup_objects
from api.auth import make_authenticator, require
from api.errors import (
    CODE_BY_HTTP_STATUS,
    SHARED_STORE_ERRORS,
    SHARED_STORE_RETRY,
    STATUS_BY_CODE,
    error_headers,
    shared_store_message,
)
from api.gateway_calls import Gateway
from api.gateway_schemas import ChatRequest, ModelCard, ModelList
from api.middleware import ApiMetrics, BodyLimit, RequestMetrics
from flywheel.db import make_engine, make_session_factory
from flywheel.errors import FlywheelError, InvalidInput
from flywheel.inference.backends import BackendError, ChatBackend
from flywheel.inference.recording import Recorder, recorder_collector
from flywheel.inference.routing import Adapters, Router
from flywheel.settings import Settings
from flywheel.tenancy.models import Domain, Tenant
from flywheel.tenancy.service import Principal, Scope

END_USER_HEADER = "x-flywheel-end-user"
CHAT_PATH = "/v1/chat/completions"
ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    504: "upstream_timeout",
}

router = APIRouter()
authorize_infer = require(Scope.INFER)
inferring = Depends(authorize_infer)


@router.post(CHAT_PATH, summary="Chat completion (OpenAI's API)")
async def chat_completions(request: Request) -> Response:
    """OpenAI's chat completion, streamed (SSE) or not, from the version `model` routes to;
    the answer carries `flywheel: {interaction_id, domain, version, role}` (in a stream's
    first chunk) and the header `X-Flywheel-Interaction-Id`, for feedback."""
    # Served by `ChatFastPath` (the route stays for the OpenAPI document). Authorized here
    # rather than as a dependency: FastAPI's dependency solving was ~9% of the gateway's
    # event loop per call (py-spy, bench.gateway zero-delay).
    principal = await authorize_infer(request)
    raw = _json_object(await request.body())
    try:
        chat = ChatRequest.model_validate(raw)
    except ValidationError as error:
        raise _invalid(error) from None
    end_user = chat.user or request.headers.get(END_USER_HEADER) or str(principal.key_id)
    gateway: Gateway = request.app.state.gateway
    return await gateway.chat(principal, chat, raw, end_user)


@router.get("/v1/models", summary="The models this key may call (OpenAI's API)")
async def list_models(request: Request, principal: Principal = inferring) -> ModelList:
    """The tenant's domains, each a `model`, and `<domain>@challenger` where one is live."""
    sessions: sessionmaker[Session] = request.app.state.sessions
    rows = await asyncio.to_thread(_domains, sessions, principal)
    gateway: Gateway = request.app.state.gateway
    cards: list[ModelCard] = []
    for name, created, tenant in rows:
        stamp = int(created.timestamp())
        cards.append(ModelCard(id=name, created=stamp, owned_by=tenant))
        release = await gateway.router.release(principal.tenant_id, name)
        if release is not None and release.challenger is not None:
            cards.append(ModelCard(id=f"{name}@challenger", created=stamp, owned_by=tenant))
    return ModelList(data=cards)


class ChatFastPath:
    """`POST /v1/chat/completions` straight from the middleware stack to `chat_completions`.

    FastAPI's route matching, request wrapper, exit stacks and exception middleware were
    about a third of the gateway's own time per call (cProfile of bench.gateway's in-process
    loop); the endpoint does all its work itself (auth, body, validation), so it runs here
    with the app's own exception handlers (OpenAI's error shape), inside the body cap and the
    request metrics (labelled by the route, as any route is). Every other request, and other
    methods on the path, go through FastAPI as before.
    """

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI) -> None:
        self.app = app
        self.fastapi_app = fastapi_app
        self.route = next(
            route
            for route in router.routes
            if isinstance(route, APIRoute) and route.path == CHAT_PATH
        )

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != CHAT_PATH:
            await self.app(scope, receive, send)
            return
        scope["route"] = self.route
        request = Request(scope, receive)
        try:
            response = await chat_completions(request)
        except Exception as error:
            handler = self._handler(error)
            if handler is None:
                raise
            response = await handler(request, error)
        await response(scope, receive, send)

    def _handler(self, error: Exception) -> Any:
        handlers = self.fastapi_app.exception_handlers
        for kind in type(error).__mro__:
            if kind in handlers:
                return handlers[kind]
        return None


def _domains(sessions: sessionmaker[Session], principal: Principal) -> list[Any]:
    with sessions() as session:
        query = (
            select(Domain.name, Domain.created_at, Tenant.name)
            .join(Tenant, Tenant.id == Domain.tenant_id)
            .where(Domain.tenant_id == principal.tenant_id)
            .order_by(Domain.name)
        )
        return list(session.execute(query).all())


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise InvalidInput(f"the body is not valid JSON: {error}") from None
    if not isinstance(raw, dict):
        raise InvalidInput("the body must be a JSON object")
    return raw


def _invalid(error: ValidationError) -> InvalidInput:
    first = error.errors(include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    return InvalidInput(
        f"invalid request: {where}: {first['msg']}", details=[{"param": where or None}]
    )


def create_gateway_app(
    settings: Settings | None = None,
    *,
    sessions: sessionmaker[Session] | None = None,
    backend: ChatBackend | None = None,
) -> FastAPI:
    """The gateway on the configured database and upstream; or on `sessions` and `backend`
    the caller owns (and closes)."""
    settings = settings or Settings()
    engine = None
    if sessions is None:
        engine = make_engine(settings)
        sessions = make_session_factory(engine)
    owns_backend = backend is None
    chat_backend = backend if backend is not None else make_backend(settings)
    recorder = Recorder(sessions, settings, redact_in_child=True)
    gateway = Gateway(
        Router(sessions, ttl_s=settings.gateway_route_cache_ttl_s),
        Adapters(
            chat_backend,
            home=settings.home.resolve(),
            tracking_uri=settings.resolved_mlflow_tracking_uri,
            is_dynamic=settings.gateway_dynamic_lora,
        ),
        chat_backend,
        recorder,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await app.state.authenticator.warm()
        await recorder.start()
        _freeze_startup_objects()
        try:
            yield
        finally:
            await gateway.aclose()
            await recorder.aclose()
            if owns_backend:
                await chat_backend.aclose()
            if engine is not None:
                engine.dispose()

    app = FastAPI(
        title="Flywheel gateway",
        version=flywheel.__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    metrics = ApiMetrics()
    metrics.registry.register(recorder_collector(recorder))
    app.state.settings = settings
    app.state.sessions = sessions
    app.state.metrics = metrics
    app.state.gateway = gateway
    app.state.authenticator = make_authenticator(settings, sessions)
    install_openai_errors(app)
    app.include_router(router)
    app.include_router(health.router)
    # The last added runs first: metrics see every request, then the body cap, then the
    # fast path of chat completions.
    app.add_middleware(ChatFastPath, fastapi_app=app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetrics, metrics=metrics)
    return app


def make_backend(settings: Settings) -> ChatBackend:
    """The configured upstream (`flywheel gateway --backend local` starts the local server
    itself and points FLYWHEEL_GATEWAY_UPSTREAM_URL at it)."""
    from flywheel.inference.upstream import OpenAIUpstream

    url = settings.gateway_upstream_url
    if not url:
        raise InvalidInput("set FLYWHEEL_GATEWAY_UPSTREAM_URL (the upstream's base URL)")
    key = settings.gateway_upstream_key
    api_key = key.get_secret_value() if key is not None else None
    return OpenAIUpstream(
        url,
        base_model=settings.gateway_base_model or listed_base_model(url, api_key),
        api_key=api_key,
        timeout_s=settings.gateway_upstream_timeout_s,
        dynamic_lora=settings.gateway_dynamic_lora,
    )


def listed_base_model(url: str, api_key: str | None) -> str:
    """The first model the upstream lists (vLLM lists its base model first)."""
    import httpx

    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url.rstrip("/") + "/models", headers=headers, timeout=10)
        return str(response.raise_for_status().json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as error:
        raise InvalidInput(
            f"the upstream at {url} did not list its models ({type(error).__name__}): "
            "set FLYWHEEL_GATEWAY_BASE_MODEL"
        ) from error


# Errors, in OpenAI's shape.


def openai_error(
    status: int,
    code: str,
    message: str,
    *,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    error_type = ERROR_TYPES.get(status, "api_error")
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def install_openai_errors(app: FastAPI) -> None:
    app.add_exception_handler(FlywheelError, _flywheel_error)  # type: ignore[arg-type]
    app.add_exception_handler(BackendError, _backend_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    for unreachable in SHARED_STORE_ERRORS:
        app.add_exception_handler(unreachable, _shared_store_error)


async def _shared_store_error(_request: Request, error: Exception) -> JSONResponse:
    return openai_error(
        503, "shared_store_unavailable", shared_store_message(error), headers=SHARED_STORE_RETRY
    )


async def _flywheel_error(_request: Request, error: FlywheelError) -> JSONResponse:
    param = (error.details or [{}])[0].get("param")
    status = STATUS_BY_CODE.get(error.code, 400)
    return openai_error(
        status, error.code, error.message, param=param, headers=error_headers(error)
    )


async def _backend_error(_request: Request, error: BackendError) -> JSONResponse:
    return openai_error(error.status, error.kind, error.message)


async def _validation_error(_request: Request, error: RequestValidationError) -> JSONResponse:
    first = error.errors()[0] if error.errors() else {}
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    message = f"invalid request: {where}: {first.get('msg', '')}"
    return openai_error(422, InvalidInput.code, message, param=where or None)


async def _http_error(_request: Request, error: HTTPException) -> JSONResponse:
    code = CODE_BY_HTTP_STATUS.get(error.status_code, "http_error")
    headers = dict(error.headers) if error.headers else None
    return openai_error(error.status_code, code, str(error.detail), headers=headers)

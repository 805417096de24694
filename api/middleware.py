"""Pure ASGI middleware: the request body cap and Prometheus request metrics."""

from __future__ import annotations

import json
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    """Raised from `receive()` once a body passes the cap; FastAPI re-raises HTTPExceptions."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request body exceeds {max_bytes} bytes")


class BodyLimit:
    """Refuse bodies over `max_bytes` with 413, never holding more than that in memory.

    A declared Content-Length over the cap is refused before anything is read; a body that
    lies about its length (or is chunked) is cut off as soon as the bytes received pass it.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _send_413(send, self.max_bytes)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)


class RequireJson:
    """Refuse a request body that is not declared as JSON (415), rather than misread it.
    A POST with no body at all (Content-Length: 0) has nothing to misread and passes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in {"POST", "PUT", "PATCH"}:
            content_type = _header(scope, b"content-type") or b""
            is_empty = not content_type and _content_length(scope) == 0
            if not is_empty and content_type.split(b";")[0].strip().lower() != b"application/json":
                message = "request bodies must be JSON: send Content-Type: application/json"
                await _send_error(send, 415, "unsupported_media_type", message)
                return
        await self.app(scope, receive, send)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    return int(value) if value is not None and value.isdigit() else None


async def _send_413(send: Send, max_bytes: int) -> None:
    await _send_error(send, 413, "payload_too_large", f"request body exceeds {max_bytes} bytes")


async def _send_error(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ApiMetrics:
    """The API's Prometheus metrics, in a registry of its own (no import-time globals).

    `labels()` costs a lock and a tuple of strings per call; the labelled children are kept
    here instead, one per label set seen (routes and statuses are few), so a request counts
    itself with two plain increments.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "flywheel_http_requests",
            "HTTP requests by route and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "flywheel_http_request_duration_seconds",
            "HTTP request latency by route.",
            ["method", "route"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )
        self.events_ingested = Counter(
            "flywheel_events_ingested",
            "Interactions and feedback events stored, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self._request_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._ingested_children: dict[str, Any] = {}

    def record_request(self, method: str, route: str, status: int, seconds: float) -> None:
        children = self._request_children.get((method, route, status))
        if children is None:
            children = (
                self.requests.labels(method, route, str(status)),
                self.latency.labels(method, route),
            )
            self._request_children[(method, route, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    def record_ingested(self, kind: str, count: int = 1) -> None:
        child = self._ingested_children.get(kind)
        if child is None:
            child = self._ingested_children[kind] = self.events_ingested.labels(kind)
        child.inc(count)


class RequestMetrics:
    """Count requests and time them, labelled by route template (never the raw path)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route: Any = scope.get("route")
            label = getattr(route, "path", "unmatched")
            self.metrics.record_request(
                scope["method"], label, status, time.perf_counter() - started
            )

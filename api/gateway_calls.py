"""One chat completion through the gateway: route, call the backend, answer, record.

Recording never delays an answer: a call's record is handed to the `Recorder` (in memory; it
writes in batches behind the responses) once the answer is known: ok, failed upstream, or
abandoned by the client mid-stream.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from api.gateway_schemas import ChatRequest
from flywheel.inference.backends import Adapter, BackendError, ChatBackend
from flywheel.inference.recording import CallRecord, Recorder
from flywheel.inference.routing import Adapters, Role, Route, Router, ServedVersion
from flywheel.tenancy.service import Principal

INTERACTION_HEADER = "X-Flywheel-Interaction-Id"
NOT_SENT_UPSTREAM = ("metadata",)
DONE = b"data: [DONE]\n\n"
CLIENT_GONE = "client disconnected"


@dataclass
class Call:
    """What one call has produced so far, and when."""

    principal: Principal
    request: ChatRequest
    raw: dict[str, Any]
    end_user: str
    route: Route
    version: ServedVersion | None
    role: Role
    adapter: Adapter | None = None
    interaction_id: uuid.UUID = field(default_factory=uuid.uuid4)
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    text: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None

    def flywheel_field(self) -> dict[str, str]:
        return {
            "interaction_id": str(self.interaction_id),
            "domain": self.route.domain,
            "version": self.version.version if self.version else "base",
            "role": self.role,
        }

    def take_completion(self, completion: dict[str, Any]) -> None:
        choice = (completion.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        self.text.append(message.get("content") or "")
        for index, call in enumerate(message.get("tool_calls") or ()):
            self.tool_calls[index] = call
        self.finish_reason = choice.get("finish_reason")
        self.usage = completion.get("usage")

    def take_chunk(self, chunk: dict[str, Any]) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.text.append(delta["content"])
            for part in delta.get("tool_calls") or ():
                self._take_tool_call_delta(part)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _take_tool_call_delta(self, part: dict[str, Any]) -> None:
        call = self.tool_calls.setdefault(
            part.get("index", 0),
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        call["id"] = part.get("id") or call["id"]
        function = part.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""

    def record(self, status: Literal["ok", "failed"], error: str | None = None) -> CallRecord:
        usage = self.usage or {}
        now = time.perf_counter()
        return CallRecord(
            interaction_id=self.interaction_id,
            tenant_id=self.principal.tenant_id,
            domain_id=self.route.domain_id,
            messages=self.raw["messages"],
            tools=self.raw.get("tools"),
            response="".join(self.text),
            response_tool_calls=[self.tool_calls[i] for i in sorted(self.tool_calls)] or None,
            model_name=self.version.registered_model if self.version else None,
            model_version=self.version.version if self.version else None,
            adapter=self.adapter.name if self.adapter else None,
            release_role=self.role,
            end_user=self.end_user,
            status=status,
            error=error,
            finish_reason=self.finish_reason,
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            latency_ms=(now - self.started) * 1000,
            ttft_ms=None if self.first_token_at is None else
            (self.first_token_at - self.started) * 1000,
            created_at=datetime.now(UTC),
        )  # fmt: skip


class Gateway:
    """The calls of one gateway process: one router, one backend, one recorder."""

    def __init__(
        self, router: Router, adapters: Adapters, backend: ChatBackend, recorder: Recorder
    ) -> None:
        self.router = router
        self.adapters = adapters
        self.backend = backend
        self.recorder = recorder
        self._background: set[asyncio.Task[None]] = set()

    async def chat(
        self, principal: Principal, request: ChatRequest, raw: dict[str, Any], end_user: str
    ) -> Response:
        route = await self.router.route(principal.tenant_id, request.model, end_user)
        call = Call(principal, request, raw, end_user, route, route.version, route.role)
        if route.shadow is not None:
            self._shadow(principal, request, raw, end_user, route)
        body = {key: value for key, value in raw.items() if key not in NOT_SENT_UPSTREAM}
        if request.stream:
            return await self._stream(call, body)
        return await self._complete(call, body)

    async def _complete(self, call: Call, body: dict[str, Any]) -> Response:
        try:
            call.adapter = await self.adapters.adapter(call.version)
            completion = await self.backend.complete(body, call.adapter)
        except BackendError as error:
            self.recorder.submit(call.record("failed", error.message))
            raise
        call.take_completion(completion)
        self.recorder.submit(call.record("ok"))
        completion["model"] = call.request.model
        completion["flywheel"] = call.flywheel_field()
        headers = {INTERACTION_HEADER: str(call.interaction_id)}
        return Response(orjson.dumps(completion), media_type="application/json", headers=headers)

    async def _stream(self, call: Call, body: dict[str, Any]) -> Response:
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        try:
            call.adapter = await self.adapters.adapter(call.version)
            chunks = aiter(self.backend.stream(body, call.adapter))
            first = await anext(chunks)
        except StopAsyncIteration:
            first = None
        except BackendError as error:
            self.recorder.submit(call.record("failed", error.message))
            raise
        call.first_token_at = time.perf_counter()
        headers = {INTERACTION_HEADER: str(call.interaction_id), "Cache-Control": "no-cache"}
        events = self._events(call, first, chunks)
        return ClosingStreamingResponse(events, media_type="text/event-stream", headers=headers)

    async def _events(
        self, call: Call, first: dict[str, Any] | None, chunks: AsyncIterator[dict[str, Any]]
    ) -> AsyncIterator[bytes]:
        outcome: tuple[Literal["ok", "failed"], str | None] = ("failed", CLIENT_GONE)
        try:
            async with aclosing(chunks):  # type: ignore[type-var]
                if first is not None:
                    first["flywheel"] = call.flywheel_field()
                    yield self._event(call, first)
                    async for chunk in chunks:
                        event = self._event(call, chunk)
                        if event:
                            yield event
                outcome = ("ok", None)
                yield DONE
        except BackendError as error:
            outcome = ("failed", error.message)
            yield _error_event(error)
        except Exception as error:
            outcome = ("failed", f"gateway error: {type(error).__name__}")
            raise
        finally:
            self.recorder.submit(call.record(*outcome))

    def _event(self, call: Call, chunk: dict[str, Any]) -> bytes:
        call.take_chunk(chunk)
        if not call.request.wants_usage:
            if chunk.get("usage") and not chunk.get("choices"):
                return b""  # the usage chunk the gateway asked for, for its own record
            chunk.pop("usage", None)
        chunk["model"] = call.request.model
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def _shadow(
        self,
        principal: Principal,
        request: ChatRequest,
        raw: dict[str, Any],
        end_user: str,
        route: Route,
    ) -> None:
        """The challenger answers as well, in the background: recorded, never returned."""
        call = Call(principal, request, raw, end_user, route, route.shadow, "shadow")
        body = {key: value for key, value in raw.items() if key not in NOT_SENT_UPSTREAM}
        body.pop("stream", None)
        body.pop("stream_options", None)
        task = asyncio.create_task(self._shadow_call(call, body))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _shadow_call(self, call: Call, body: dict[str, Any]) -> None:
        try:
            call.adapter = await self.adapters.adapter(call.version)
            call.take_completion(await self.backend.complete(body, call.adapter))
        except BackendError as error:
            self.recorder.submit(call.record("failed", error.message))
            return
        self.recorder.submit(call.record("ok"))

    async def aclose(self) -> None:
        """Let shadow calls in flight finish (they are recorded)."""
        if self._background:
            await asyncio.wait(list(self._background), timeout=10)


def _error_event(error: BackendError) -> bytes:
    """A stream's last event when the upstream failed mid-stream: the openai client raises an
    `APIError` with this message."""
    body = {
        "error": {
            "message": error.message,
            "type": "upstream_error",
            "param": None,
            "code": error.kind,
        }
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


class ClosingStreamingResponse(StreamingResponse):
    """Server-sent events that end as soon as the client goes, and close their body iterator
    whichever way they end (Starlette would leave the generator, and the upstream stream it
    holds, to the garbage collector).

    Starlette's `StreamingResponse` watches for the disconnect (ASGI spec < 2.4, uvicorn's)
    with an anyio task group per response, some 100 us of the event loop per stream here; one
    plain task watches `receive` instead and cancels the streaming task where it waits (for
    the upstream's next chunk, say), which then ends as Starlette's does: the response left
    unfinished, the generator closed, the call recorded as abandoned."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.current_task()
        assert streaming is not None
        watch = DisconnectWatch(streaming)
        watcher = asyncio.ensure_future(watch.wait(receive))
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not watch.has_cancelled or streaming.uncancel() > 0:
                raise  # cancelled from elsewhere (a shutdown): not ours to swallow
        finally:
            watch.is_over = True  # set before any await: the watcher cancels nothing after it
            watcher.cancel()
            closing = getattr(self.body_iterator, "aclose", None)
            if closing is not None:
                await closing()
        if self.background is not None:
            await self.background()


class DisconnectWatch:
    """Cancels `streaming` when the client disconnects before the stream is over."""

    def __init__(self, streaming: asyncio.Task[Any]) -> None:
        self.streaming = streaming
        self.is_over = False
        self.has_cancelled = False

    async def wait(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self.is_over:
            self.has_cancelled = True
            self.streaming.cancel()

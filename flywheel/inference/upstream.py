"""An OpenAI-compatible upstream (vLLM `--enable-lora`, SGLang, LoRAX, `finetune.serve`) as a
`ChatBackend`: HTTP/1.1 keep-alive connections (httpx), at most `max_connections` of them,
spread over pools of at most `CONNECTIONS_PER_POOL` taken in turn (see there why).

`base_url` is the one ending in `/v1`, as the `openai` client takes it. Adapters are served by
name: with `dynamic_lora` (vLLM's `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) an adapter is loaded
once per name with `POST {base_url}/load_lora_adapter {"lora_name", "lora_path"}`, and vLLM's
400 "... has already been loaded." counts as loaded; without it the adapter must be one the
upstream lists in `GET {base_url}/models` (started with `--lora-modules`).

Failures are `BackendError`s: `unavailable` (nothing listens, connect refused or timed out),
`timeout` (no byte within `timeout_s`, between stream chunks too; or no pooled connection free
within it), `upstream_error` (a non-2xx answer, an `error` event in a stream, invalid JSON),
`dropped` (the connection broke, or a stream ended without `data: [DONE]`).

The stream is lazy: nothing is sent before the first `__anext__`, and an upstream refusal is
raised there, before any chunk, so a caller can still answer with an error status.
`stream_options` is passed through as given (send `{"include_usage": true}` to get usage).
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import httpx
import orjson

from flywheel.inference.backends import Adapter, BackendError

MAX_MESSAGE_CHARS = 200  # of an upstream's error message passed on to the caller
JSON_HEADERS = {"content-type": "application/json"}
# httpcore 1.0's pool does O(connections^2) work on every request and response (it counts all
# its connections once per idle one): past ~16 connections that dominates a request's cost, so
# the connections are spread over pools of at most this many, taken in turn.
CONNECTIONS_PER_POOL = 16
T = TypeVar("T")


class OpenAIUpstream:
    """A `ChatBackend` speaking OpenAI's chat completions to one upstream server."""

    def __init__(
        self,
        base_url: str,
        *,
        base_model: str,
        api_key: str | None = None,
        timeout_s: float = 60,
        connect_timeout_s: float = 5,
        dynamic_lora: bool = True,
        max_connections: int = 100,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._base_model = base_model
        self._is_dynamic_lora = dynamic_lora
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        tls = ssl.create_default_context()  # one for all the pools (each costs ~20 ms)
        self._clients = [
            _pooled_client(headers, timeout, tls, size)
            for size in pool_sizes(max_connections, CONNECTIONS_PER_POOL)
        ]
        self._turn = itertools.cycle(self._clients)
        self._ready: set[str] = set()  # adapter names loaded (or listed) on the upstream
        self._attempts: dict[str, asyncio.Future[None]] = {}  # loads under way, by name

    @property
    def base_model(self) -> str:
        return self._base_model

    @property
    def base_url(self) -> str:
        return self._base_url

    async def ensure_adapter(self, adapter: Adapter) -> None:
        """One upstream call per name however many ask at once (they share its outcome, a
        failure too; the next call after a failure tries again); none once it is ready."""
        if adapter.name in self._ready:
            return
        attempt = self._attempts.get(adapter.name)
        if attempt is None:
            attempt = asyncio.ensure_future(self._make_ready(adapter))
            self._attempts[adapter.name] = attempt
            attempt.add_done_callback(lambda done: self._settle(adapter.name, done))
        await asyncio.shield(attempt)  # a caller cancelled does not cancel the others' load

    async def _make_ready(self, adapter: Adapter) -> None:
        if self._is_dynamic_lora:
            await self._load_adapter(adapter)
        else:
            await self._check_listed(adapter)
        self._ready.add(adapter.name)

    def _settle(self, name: str, attempt: asyncio.Future[None]) -> None:
        del self._attempts[name]
        if not attempt.cancelled():
            attempt.exception()  # retrieved: every caller may have gone before it failed

    async def complete(self, body: dict[str, Any], adapter: Adapter | None) -> dict[str, Any]:
        payload = {**body, "model": self._model_of(adapter)}
        payload.pop("stream", None)
        payload.pop("stream_options", None)  # vLLM refuses it without `stream`
        response = await self._send("POST", "/chat/completions", payload)
        if response.status_code >= 300:
            self._forget_on_404(response, adapter)
            raise upstream_error(response)
        answer = parse_json(response.content)
        if not isinstance(answer, dict):
            raise BackendError("upstream_error", "the upstream answered invalid JSON")
        return answer

    async def stream(
        self, body: dict[str, Any], adapter: Adapter | None
    ) -> AsyncIterator[dict[str, Any]]:
        payload = {**body, "model": self._model_of(adapter), "stream": True}
        client = next(self._turn)
        request = client.build_request(
            "POST",
            self._url("/chat/completions"),
            content=orjson.dumps(payload),
            headers=JSON_HEADERS,
        )
        response = await _call(lambda: client.send(request, stream=True))
        try:
            if response.status_code >= 300:
                await _call(response.aread)
                self._forget_on_404(response, adapter)
                raise upstream_error(response)
            events, pieces = SseEvents(), response.aiter_bytes()
            while True:
                for event in events.feed(await _next_piece(pieces)):
                    if event == b"[DONE]":
                        return
                    yield parse_chunk(event)
        finally:
            await response.aclose()  # unread: the connection is closed, the upstream sees it

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()

    # The adapters.
    async def _load_adapter(self, adapter: Adapter) -> None:
        payload = {"lora_name": adapter.name, "lora_path": str(adapter.path)}
        response = await self._send("POST", "/load_lora_adapter", payload)
        if response.status_code < 300 or is_already_loaded(response):
            return
        raise upstream_error(response, f"loading adapter {adapter.name!r} failed")

    async def _check_listed(self, adapter: Adapter) -> None:
        response = await self._send("GET", "/models", None)
        if response.status_code >= 300:
            raise upstream_error(response)
        listing = parse_json(response.content)
        data = listing.get("data") if isinstance(listing, dict) else None
        names = {card.get("id") for card in data or [] if isinstance(card, dict)}
        if adapter.name not in names:
            message = f"the upstream does not serve adapter {adapter.name!r} (not in /models)"
            raise BackendError("upstream_error", message, upstream_status=response.status_code)

    def _forget_on_404(self, response: httpx.Response, adapter: Adapter | None) -> None:
        """An upstream restarted has lost its dynamically loaded adapters: load again next time."""
        if adapter is not None and response.status_code == 404:
            self._ready.discard(adapter.name)

    # HTTP.
    def _model_of(self, adapter: Adapter | None) -> str:
        return adapter.name if adapter is not None else self._base_model

    def _url(self, path: str) -> str:
        return self._base_url + path

    async def _send(self, method: str, path: str, payload: Any) -> httpx.Response:
        content = None if payload is None else orjson.dumps(payload)
        headers = None if payload is None else JSON_HEADERS
        url, client = self._url(path), next(self._turn)
        return await _call(lambda: client.request(method, url, content=content, headers=headers))


def pool_sizes(max_connections: int, per_pool: int) -> list[int]:
    """`max_connections` spread evenly over as few pools of at most `per_pool` as hold them.

    >>> pool_sizes(100, 16), pool_sizes(10, 16), pool_sizes(0, 16)
    ([15, 15, 14, 14, 14, 14, 14], [10], [1])
    """
    count = max(1, -(-max_connections // per_pool))
    total = max(count, max_connections)
    return [total // count + (1 if i < total % count else 0) for i in range(count)]


def _pooled_client(
    headers: dict[str, str], timeout: httpx.Timeout, tls: ssl.SSLContext, size: int
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        headers=headers,
        timeout=timeout,
        verify=tls,
        limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
        http1=True,
        http2=False,
        trust_env=False,  # never a proxy from the environment between us and the upstream
    )


async def _call(action: Callable[[], Awaitable[T]]) -> T:
    """`action()` awaited, its transport failures as BackendErrors."""
    try:
        return await action()
    except httpx.HTTPError as error:
        raise_backend_error(error)


def raise_backend_error(error: httpx.HTTPError) -> NoReturn:
    """The BackendError for a transport failure (never the upstream's address or internals)."""
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
        raise BackendError("unavailable", "the upstream cannot be reached") from error
    if isinstance(error, httpx.TimeoutException):
        raise BackendError("timeout", "the upstream did not answer in time") from error
    if isinstance(error, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        raise BackendError("dropped", "the upstream closed the connection mid-answer") from error
    raise BackendError(
        "unavailable", f"the upstream request failed ({type(error).__name__})"
    ) from error


async def _next_piece(pieces: AsyncIterator[bytes]) -> bytes:
    try:
        return await anext(pieces)
    except StopAsyncIteration:
        raise BackendError("dropped", "the upstream stream ended before [DONE]") from None
    except httpx.HTTPError as error:
        raise_backend_error(error)


class SseEvents:
    """Server-sent events from bytes as they arrive: each event's `data` (its `data:` lines
    joined), once the blank line that ends it is in."""

    def __init__(self) -> None:
        self._pending = b""
        self._data: list[bytes] = []

    def feed(self, piece: bytes) -> list[bytes]:
        lines = (self._pending + piece).split(b"\n")
        self._pending = lines.pop()
        events = []
        for line in lines:
            line = line.removesuffix(b"\r")
            if line.startswith(b"data:"):
                self._data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif not line and self._data:
                events.append(b"\n".join(self._data))
                self._data.clear()
        return events  # comments (`:`), other fields and empty events are skipped


def parse_chunk(event: bytes) -> dict[str, Any]:
    chunk = parse_json(event)
    if not isinstance(chunk, dict):
        raise BackendError("upstream_error", "the upstream streamed invalid JSON")
    if "error" in chunk or chunk.get("object") == "error":  # vLLM's error event mid-stream
        raise BackendError("upstream_error", error_message(chunk) or "the upstream failed")
    return chunk


def parse_json(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None


def error_message(answer: Any) -> str | None:
    """The `message` of OpenAI's `{"error": {...}}` or vLLM's older flat `{"object": "error"}`,
    truncated; None when there is none."""
    if not isinstance(answer, dict):
        return None
    error = answer.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    if not isinstance(message, str):
        message = answer.get("message")
    if not isinstance(message, str) or not message:
        return None
    if len(message) > MAX_MESSAGE_CHARS:
        return message[: MAX_MESSAGE_CHARS - 1] + "…"
    return message


def upstream_error(response: httpx.Response, context: str | None = None) -> BackendError:
    status = response.status_code
    detail = error_message(parse_json(response.content)) or f"HTTP {status}"
    message = f"the upstream answered {status}: {detail}"
    if context:
        message = f"{context}: {message}"
    return BackendError("upstream_error", message, upstream_status=status)


def is_already_loaded(response: httpx.Response) -> bool:
    """vLLM's 400 "The lora adapter 'x' has already been loaded." for a name it holds."""
    if response.status_code != 400:
        return False
    message = error_message(parse_json(response.content)) or ""
    return "already" in message and "loaded" in message

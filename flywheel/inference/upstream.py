"""An OpenAI-compatible upstream (vLLM `--enable-lora`, SGLang, LoRAX, `finetune.serve`) as a
`ChatBackend`: one pooled HTTP/1.1 keep-alive client per upstream.

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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import httpx
import orjson

from flywheel.inference.backends import Adapter, BackendError

MAX_MESSAGE_CHARS = 200  # of an upstream's error message passed on to the caller
JSON_HEADERS = {"content-type": "application/json"}
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
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            http1=True,
            http2=False,
            trust_env=False,  # never a proxy from the environment between us and the upstream
        )
        self._ready: set[str] = set()  # adapter names loaded (or listed) on the upstream
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def base_model(self) -> str:
        return self._base_model

    @property
    def base_url(self) -> str:
        return self._base_url

    async def ensure_adapter(self, adapter: Adapter) -> None:
        if adapter.name in self._ready:
            return
        lock = self._locks.setdefault(adapter.name, asyncio.Lock())
        async with lock:
            if adapter.name in self._ready:
                return
            if self._is_dynamic_lora:
                await self._load_adapter(adapter)
            else:
                await self._check_listed(adapter)
            self._ready.add(adapter.name)

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
        request = self._client.build_request(
            "POST",
            self._url("/chat/completions"),
            content=orjson.dumps(payload),
            headers=JSON_HEADERS,
        )
        response = await _call(lambda: self._client.send(request, stream=True))
        try:
            if response.status_code >= 300:
                await _call(response.aread)
                self._forget_on_404(response, adapter)
                raise upstream_error(response)
            async for chunk in _sse_chunks(response):
                yield chunk
        finally:
            await response.aclose()  # unread: the connection is closed, the upstream sees it

    async def aclose(self) -> None:
        await self._client.aclose()

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
        url = self._url(path)
        return await _call(
            lambda: self._client.request(method, url, content=content, headers=headers)
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


async def _sse_chunks(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an SSE stream's `data:` events, until `data: [DONE]`."""
    pending = b""
    data: list[bytes] = []
    stream = response.aiter_bytes()
    while True:
        try:
            piece = await anext(stream)
        except StopAsyncIteration:
            raise BackendError("dropped", "the upstream stream ended before [DONE]") from None
        except httpx.HTTPError as error:
            raise_backend_error(error)
        lines = (pending + piece).split(b"\n")
        pending = lines.pop()
        for line in lines:
            event = _sse_line(line.rstrip(b"\r"), data)
            if event is None:
                continue
            if event == b"[DONE]":
                return
            yield parse_chunk(event)


def _sse_line(line: bytes, data: list[bytes]) -> bytes | None:
    """Feed one line; the event's data once a blank line ends it (or a lone `data:` line)."""
    if line.startswith(b"data:"):
        data.append(line[6:] if line[5:6] == b" " else line[5:])
        return None
    if line or not data:
        return None  # a comment, another field, or a blank line with no data before it
    event = b"\n".join(data)
    data.clear()
    return event


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

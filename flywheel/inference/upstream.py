"""An OpenAI-compatible upstream (vLLM `--enable-lora`, SGLang, LoRAX, `finetune.serve`) as a
`ChatBackend`: HTTP/1.1 keep-alive connections (aiohttp, one session), at most
`max_connections` of them.

aiohttp rather than httpx: against the stand-in, one client process doing 16 concurrent
non-streamed completions, httpx 0.28 managed ~450 requests/s and aiohttp 3.14 ~2,800-4,500 on
the same 2-core machine (`httpcore`'s pool and h11 cost ~2 ms of CPU per request); in the
gateway that was about half its event loop's time.

`base_url` is the one ending in `/v1`, as the `openai` client takes it. Adapters are served by
name: with `dynamic_lora` (vLLM's `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) an adapter is loaded
once per name with `POST {base_url}/load_lora_adapter {"lora_name", "lora_path"}`, and vLLM's
400 "... has already been loaded." counts as loaded; without it the adapter must be one the
upstream lists in `GET {base_url}/models` (started with `--lora-modules`).

Failures are `BackendError`s: `unavailable` (nothing listens, connect refused or timed out),
`timeout` (no byte within `timeout_s`, between stream chunks too), `upstream_error` (a non-2xx
answer, an `error` event in a stream, invalid JSON), `dropped` (the connection broke, or a
stream ended without `data: [DONE]`). Waiting for a pooled connection counts in the connect
timeout (aiohttp's `connect` covers both), so a pool full for that long is `unavailable`.

The stream is lazy: nothing is sent before the first `__anext__`, and an upstream refusal is
raised there, before any chunk, so a caller can still answer with an error status.
`stream_options` is passed through as given (send `{"include_usage": true}` to get usage).
The session is made on first use, inside the event loop that uses it (aiohttp's rule).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import aiohttp
import orjson

from flywheel.inference.backends import Adapter, BackendError

MAX_MESSAGE_CHARS = 200  # of an upstream's error message passed on to the caller
JSON_HEADERS = {"content-type": "application/json"}


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
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_read=timeout_s
        )
        self._max_connections = max(1, max_connections)
        self._client: aiohttp.ClientSession | None = None
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
        status, content = await self._send("POST", "/chat/completions", payload)
        if status >= 300:
            self._forget_on_404(status, adapter)
            raise upstream_error(status, content)
        answer = parse_json(content)
        if not isinstance(answer, dict):
            raise BackendError("upstream_error", "the upstream answered invalid JSON")
        return answer

    async def stream(
        self, body: dict[str, Any], adapter: Adapter | None
    ) -> AsyncIterator[dict[str, Any]]:
        payload = orjson.dumps({**body, "model": self._model_of(adapter), "stream": True})
        url, session = self._url("/chat/completions"), self._session()
        try:
            response = await session.post(url, data=payload, headers=JSON_HEADERS)
        except aiohttp.ClientError as error:
            raise_backend_error(error)
        is_done = False
        try:
            if response.status >= 300:
                content = await _read(response)
                self._forget_on_404(response.status, adapter)
                raise upstream_error(response.status, content)
            events = SseEvents()
            while True:
                for event in events.feed(await _next_piece(response)):
                    if event == b"[DONE]":
                        is_done = True
                        return
                    yield parse_chunk(event)
        finally:
            if is_done:
                response.release()  # kept alive when the body is all in, else closed
            else:
                response.close()  # unread: the connection is closed, the upstream sees it

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
            await asyncio.sleep(0)  # the transports close their sockets on the next loop step

    # The adapters.
    async def _load_adapter(self, adapter: Adapter) -> None:
        payload = {"lora_name": adapter.name, "lora_path": str(adapter.path)}
        status, content = await self._send("POST", "/load_lora_adapter", payload)
        if status < 300 or is_already_loaded(status, content):
            return
        raise upstream_error(status, content, f"loading adapter {adapter.name!r} failed")

    async def _check_listed(self, adapter: Adapter) -> None:
        status, content = await self._send("GET", "/models", None)
        if status >= 300:
            raise upstream_error(status, content)
        listing = parse_json(content)
        data = listing.get("data") if isinstance(listing, dict) else None
        names = {card.get("id") for card in data or [] if isinstance(card, dict)}
        if adapter.name not in names:
            message = f"the upstream does not serve adapter {adapter.name!r} (not in /models)"
            raise BackendError("upstream_error", message, upstream_status=status)

    def _forget_on_404(self, status: int, adapter: Adapter | None) -> None:
        """An upstream restarted has lost its dynamically loaded adapters: load again next time."""
        if adapter is not None and status == 404:
            self._ready.discard(adapter.name)

    # HTTP.
    def _model_of(self, adapter: Adapter | None) -> str:
        return adapter.name if adapter is not None else self._base_model

    def _url(self, path: str) -> str:
        return self._base_url + path

    def _session(self) -> aiohttp.ClientSession:
        if self._client is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections,
                limit_per_host=0,
                ssl=ssl.create_default_context(),
            )
            self._client = aiohttp.ClientSession(
                connector=connector,
                headers=self._headers,
                timeout=self._timeout,
                trust_env=False,  # never a proxy from the environment between us and the upstream
                skip_auto_headers=("User-Agent",),
            )
        return self._client

    async def _send(self, method: str, path: str, payload: Any) -> tuple[int, bytes]:
        """The answer's status and whole body, transport failures as BackendErrors."""
        data = None if payload is None else orjson.dumps(payload)
        headers = None if payload is None else JSON_HEADERS
        session = self._session()
        try:
            async with session.request(
                method, self._url(path), data=data, headers=headers
            ) as response:
                return response.status, await response.read()
        except aiohttp.ClientError as error:
            raise_backend_error(error)


async def _read(response: aiohttp.ClientResponse) -> bytes:
    try:
        return await response.read()
    except aiohttp.ClientError as error:
        raise_backend_error(error)


def raise_backend_error(error: aiohttp.ClientError) -> NoReturn:
    """The BackendError for a transport failure (never the upstream's address or internals)."""
    if isinstance(error, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        raise BackendError("unavailable", "the upstream cannot be reached") from error
    if isinstance(error, aiohttp.ServerTimeoutError):
        raise BackendError("timeout", "the upstream did not answer in time") from error
    if isinstance(
        error,
        aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientOSError
        | aiohttp.ClientResponseError,
    ):  # fmt: skip
        raise BackendError("dropped", "the upstream closed the connection mid-answer") from error
    raise BackendError(
        "unavailable", f"the upstream request failed ({type(error).__name__})"
    ) from error


async def _next_piece(response: aiohttp.ClientResponse) -> bytes:
    try:
        piece = await response.content.readany()
    except aiohttp.ClientError as error:
        raise_backend_error(error)
    if not piece:
        raise BackendError("dropped", "the upstream stream ended before [DONE]")
    return piece


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


def upstream_error(status: int, content: bytes, context: str | None = None) -> BackendError:
    detail = error_message(parse_json(content)) or f"HTTP {status}"
    message = f"the upstream answered {status}: {detail}"
    if context:
        message = f"{context}: {message}"
    return BackendError("upstream_error", message, upstream_status=status)


def is_already_loaded(status: int, content: bytes) -> bool:
    """vLLM's 400 "The lora adapter 'x' has already been loaded." for a name it holds."""
    if status != 400:
        return False
    message = error_message(parse_json(content)) or ""
    return "already" in message and "loaded" in message

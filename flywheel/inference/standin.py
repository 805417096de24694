"""A stand-in for an OpenAI-compatible LoRA server (the subset of vLLM's protocol the gateway
speaks), for tests and `bench/gateway.py`: no model, deterministic answers, every request kept.

    python -m flywheel.inference.standin --port 0 [--delay-ms N] [--chunks N]
    -> prints `flywheel-serve listening on http://127.0.0.1:PORT` once it serves

or in-process: `with serve_in_thread(StandinConfig(...)) as running:` (`running.base_url`,
`running.app.requests`), or `create_standin_app(config)` for any ASGI server.

Routes (base URL `http://HOST:PORT/v1`):
- `GET /v1/models`: the base model and the loaded adapters, vLLM's model cards.
- `POST /v1/chat/completions`: `model` must be the base or a loaded adapter (else vLLM's 404);
  the answer is `reply from <model> to: <last user text>` (after a `tool` message: `reply from
  <model> to tool result: <its text>`), cut before the first of the `stop` strings in it
  (finish_reason "stop", as a model server stops there), then to
  `max_completion_tokens`/`max_tokens` words (finish_reason "length"). Tokens are counted as
  whitespace-separated words. Streamed: a role chunk, the content in `chunks` pieces, a chunk
  with finish_reason, the usage chunk (choices []) when `stream_options.include_usage`, then
  `data: [DONE]`.
- Tool calls: when the request has `tools` and the last message is a user message whose text
  contains `call <function name>` of one of them, the answer is that call (content null,
  finish_reason "tool_calls"); its arguments give each parameter property a sample value (a
  string property the user text, numbers 1, booleans true, others null).
- `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`: 200 text; 400 when the name is
  loaded already ("... has already been loaded."); 404 when the path is not a directory (vLLM
  cannot load it either). `POST /v1/unload_lora_adapter {"lora_name"}`: 200, or 404 unknown.
- `GET /_standin/requests`: every request received (method, path, headers, body, the client's
  port (one per connection), and for chat completions `disconnected`: the client left before
  the answer ended); `DELETE` empties it.
  In-process: `StandinApp.requests`.
- `--api-key KEY` (as vLLM's): requests without `Authorization: Bearer KEY` get 401
  `{"error": "Unauthorized"}`. `--base-model NAME` names the base (default `standin-base`).

Faults, per request, in the header `X-Standin-Fault` or in the last user message as
`[standin:...]` (both may be given; the message's win), comma- or space-separated:
`delay-ms=N` (before the answer), `status=N` (answer that error status, OpenAI's error shape),
`drop-after=N` (a stream breaks after N chunks; a non-streamed answer after half its body),
`chunk-delay-ms=N` (between stream chunks), `hang` (never answer; wait for the client to go).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from flywheel.inference.standin_replies import (
    Fault,
    Reply,
    completion_body,
    compose_reply,
    read_fault,
    stream_events,
)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

UNFINISHED = "ASGI callable returned without completing response."  # uvicorn's, on a drop


@dataclass(frozen=True)
class StandinConfig:
    base_model: str = "standin-base"
    delay_ms: float = 0  # before every chat answer
    chunks: int = 4  # content pieces of a streamed answer
    chunk_delay_ms: float = 0
    max_model_len: int = 4096
    record_limit: int = 100_000  # requests kept (the oldest go first)
    api_key: str | None = None  # as vLLM's --api-key: /v1 wants `Authorization: Bearer <it>`


@dataclass
class StandinApp:
    """The ASGI app. `requests` holds what it received, newest last."""

    config: StandinConfig = field(default_factory=StandinConfig)
    adapters: dict[str, str] = field(default_factory=dict)  # name -> path
    requests: deque[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.requests = deque(maxlen=self.config.record_limit)
        key = self.config.api_key
        self._authorization = f"Bearer {key}".encode() if key else None
        self._routes: dict[tuple[str, str], Callable[..., Awaitable[None]]] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("GET", "/v1/models"): self._models,
            ("POST", "/v1/load_lora_adapter"): self._load,
            ("POST", "/v1/unload_lora_adapter"): self._unload,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if path == "/_standin/requests":
            await self._own(method, send)
            return
        body = await _read_body(receive)
        record: dict[str, Any] = {
            "method": method,
            "path": path,
            "headers": {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]},
            "body": _parse(body),
            "client_port": (scope.get("client") or (None, None))[1],  # one per connection
        }
        self.requests.append(record)
        route = self._routes.get((method, path))
        if self._authorization is not None and scope_authorization(scope) != self._authorization:
            await send_json(send, 401, {"error": "Unauthorized"})  # vLLM's answer
        elif route is not None:
            await route(scope, receive, send, record)
        elif any(p == path for _, p in self._routes):
            await send_json(send, 405, {"detail": "Method Not Allowed"})
        else:
            await send_json(send, 404, {"detail": "Not Found"})

    async def _own(self, method: str, send: Send) -> None:
        if method == "DELETE":
            self.requests.clear()
            await send_json(send, 200, [])
        else:
            await send_json(send, 200, list(self.requests))

    # /v1/models and the adapters.
    async def _models(self, scope: Scope, receive: Receive, send: Send, record: Any) -> None:
        base = self.config.base_model
        cards = [_card(base, base, None, self.config.max_model_len)]
        cards += [_card(name, path, base, None) for name, path in self.adapters.items()]
        await send_json(send, 200, {"object": "list", "data": cards})

    async def _load(self, scope: Scope, receive: Receive, send: Send, record: Any) -> None:
        body = record["body"] if isinstance(record["body"], dict) else {}
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            message = "Both 'lora_name' and 'lora_path' must be provided."
            await send_error(send, 400, message, "InvalidUserInput")
        elif name in self.adapters:
            message = f"The lora adapter '{name}' has already been loaded."
            await send_error(send, 400, message, "InvalidUserInput")
        elif not Path(str(path)).is_dir():
            message = f"Loading lora {name} failed: No adapter found for {path}"
            await send_error(send, 404, message, "NotFoundError")
        else:
            self.adapters[str(name)] = str(path)
            await send_text(send, 200, f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload(self, scope: Scope, receive: Receive, send: Send, record: Any) -> None:
        body = record["body"] if isinstance(record["body"], dict) else {}
        name = body.get("lora_name")
        if not name:
            message = "either 'lora_name' and 'lora_int_id' needs to be provided."
            await send_error(send, 400, message, "InvalidUserInput")
        elif name not in self.adapters:
            message = f"The lora adapter '{name}' cannot be found."
            await send_error(send, 404, message, "NotFoundError")
        else:
            del self.adapters[name]
            await send_text(send, 200, f"Success: LoRA adapter '{name}' removed successfully.")

    # /v1/chat/completions.
    async def _chat(self, scope: Scope, receive: Receive, send: Send, record: Any) -> None:
        record["disconnected"] = False
        request = record["body"]
        problem = self._refusal(request)
        if problem is not None:
            await send_error(send, *problem)
            return
        fault = read_fault(scope["headers"], request["messages"])
        if fault.is_hang:
            await _until_disconnect(receive)
            record["disconnected"] = True
            return
        delay_ms = self.config.delay_ms if fault.delay_ms is None else fault.delay_ms
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        if fault.status is not None:
            await send_error(send, fault.status, f"stand-in fault: status {fault.status}")
            return
        model = request["model"]
        reply = compose_reply(request, model)
        if request.get("stream"):
            await self._stream(receive, send, request, reply, fault, record)
        else:
            await self._complete(send, model, reply, fault)

    def _refusal(self, request: Any) -> tuple[int, str, str, str | None] | None:
        if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
            return 400, "the body must be a JSON object with `messages`", "BadRequestError", None
        model = request.get("model")
        if model != self.config.base_model and model not in self.adapters:
            return 404, f"The model `{model}` does not exist.", "NotFoundError", "model"
        return None

    async def _complete(self, send: Send, model: str, reply: Reply, fault: Fault) -> None:
        body = orjson.dumps(completion_body(model, reply))
        if fault.drop_after is not None:
            await _start(send, 200, b"application/json", len(body))
            await send(
                {"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True}
            )
            return  # uvicorn closes the connection: the body never completes
        await send_bytes(send, 200, b"application/json", body)

    async def _stream(
        self, receive: Receive, send: Send, request: Any, reply: Reply, fault: Fault, record: Any
    ) -> None:
        options = request.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        events = stream_events(request["model"], reply, self.config.chunks, include_usage)
        delay_ms = (
            self.config.chunk_delay_ms if fault.chunk_delay_ms is None else fault.chunk_delay_ms
        )
        gone = asyncio.Event()
        watcher = asyncio.ensure_future(_watch_disconnect(receive, gone))
        try:
            await _start(send, 200, b"text/event-stream", None)
            for index, event in enumerate(events):
                if fault.drop_after is not None and index >= fault.drop_after:
                    return  # uvicorn closes the connection: the chunked body never ends
                if index and delay_ms > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(gone.wait(), delay_ms / 1000)
                if gone.is_set():
                    record["disconnected"] = True
                    return
                await send({"type": "http.response.body", "body": event, "more_body": True})
            watcher.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()


# ASGI plumbing.
def scope_authorization(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return bytes(value)
    return None


def _card(name: str, root: str, parent: str | None, max_model_len: int | None) -> dict[str, Any]:
    card: dict[str, Any] = {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "permission": [],
    }
    if max_model_len is not None:
        card["max_model_len"] = max_model_len
    return card


def _parse(body: bytes) -> Any:
    if not body:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return {"_unparsed": body[:1000].decode("utf-8", "replace")}


async def _read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(parts)


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    await _until_disconnect(receive)
    gone.set()


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _start(send: Send, status: int, content_type: bytes, length: int | None) -> None:
    headers = [(b"content-type", content_type)]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    else:
        headers.append((b"cache-control", b"no-cache"))
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def send_bytes(send: Send, status: int, content_type: bytes, body: bytes) -> None:
    await _start(send, status, content_type, len(body))
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, value: Any) -> None:
    await send_bytes(send, status, b"application/json", orjson.dumps(value))


async def send_text(send: Send, status: int, text: str) -> None:
    await send_bytes(send, status, b"text/plain; charset=utf-8", text.encode())


async def send_error(
    send: Send,
    status: int,
    message: str,
    kind: str = "InternalServerError",
    param: str | None = None,
) -> None:
    error = {"message": message, "type": kind, "param": param, "code": status}
    await send_json(send, status, {"error": error})


# Serving.
class _QuietDrops(logging.Filter):
    """uvicorn's complaint about the answers a `drop-after` fault leaves unfinished."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != UNFINISHED


def create_standin_app(config: StandinConfig | None = None) -> StandinApp:
    error_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietDrops) for f in error_log.filters):
        error_log.addFilter(_QuietDrops())
    return StandinApp(config or StandinConfig())


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def _server(app: StandinApp) -> Any:
    import uvicorn  # imported here: only a serving process needs it

    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2
    )
    return uvicorn.Server(config)


@dataclass
class RunningStandin:
    app: StandinApp
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@contextlib.contextmanager
def serve_in_thread(config: StandinConfig | None = None) -> Iterator[RunningStandin]:
    """The stand-in on a loopback port, in a thread of this process, until the block ends."""
    app = create_standin_app(config)
    sock = bind("127.0.0.1", 0)
    server = _server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the stand-in server did not start")
            time.sleep(0.01)
        yield RunningStandin(app, sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


async def _serve(app: StandinApp, sock: socket.socket) -> None:
    server = _server(app)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if server.started:
        host, port = sock.getsockname()[:2]
        print(f"flywheel-serve listening on http://{host}:{port}", flush=True)
    await task


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flywheel.inference.standin")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--base-model", default=StandinConfig.base_model)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--chunks", type=int, default=StandinConfig.chunks)
    parser.add_argument("--chunk-delay-ms", type=float, default=0.0)
    parser.add_argument("--record-limit", type=int, default=StandinConfig.record_limit)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args(argv)
    config = StandinConfig(
        base_model=args.base_model,
        delay_ms=args.delay_ms,
        chunks=args.chunks,
        chunk_delay_ms=args.chunk_delay_ms,
        record_limit=args.record_limit,
        api_key=args.api_key,
    )
    app = create_standin_app(config)
    with (
        contextlib.suppress(KeyboardInterrupt),
        asyncio.Runner(loop_factory=_loop_factory()) as runner,
    ):
        runner.run(_serve(app, bind(args.host, args.port)))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # uvicorn[standard] brings it; asyncio's own loop works too
        return None
    return uvloop.new_event_loop


if __name__ == "__main__":
    main()

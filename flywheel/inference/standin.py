"""A stand-in for an OpenAI-compatible LoRA server (the subset of vLLM's protocol the gateway
speaks), for tests and `bench/gateway.py`: no model, deterministic answers, every request kept.

    python -m flywheel.inference.standin --port 0 [--delay-ms N] [--chunks N]
    -> prints `flywheel-serve listening on http://127.0.0.1:PORT` once it serves

Routes (base URL `http://HOST:PORT/v1`):
- `GET /v1/models`: the base model and the loaded adapters, vLLM's model cards.
- `POST /v1/chat/completions`: `model` must be the base or a loaded adapter (else vLLM's 404);
  the answer is `reply from <model> to: <last user text>` (after a `tool` message: `reply from
  <model> to tool result: <its text>`), cut to `max_completion_tokens`/`max_tokens` words
  (finish_reason "length"). Tokens are counted as whitespace-separated words. Streamed: a role
  chunk, the content in `chunks` pieces, a chunk with finish_reason, the usage chunk (choices
  []) when `stream_options.include_usage`, then `data: [DONE]`.
- Tool calls: when the request has `tools` and the last message is a user message whose text
  contains `call <function name>` of one of them, the answer is that call (content null,
  finish_reason "tool_calls"); its arguments give each parameter property a sample value (a
  string property the user text, numbers 1, booleans true, others null).
- `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`: 200 text; 400 when the name is
  loaded already ("... has already been loaded."); 404 when the path is not a directory (vLLM
  cannot load it either). `POST /v1/unload_lora_adapter {"lora_name"}`: 200, or 404 unknown.
- `GET /_standin/requests`: every request received (method, path, headers, body, and for chat
  completions `disconnected`: the client left before the answer ended); `DELETE` empties it.
  In-process: `StandinApp.requests`.

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
import math
import re
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

FAULT_HEADER = b"x-standin-fault"
FAULT_IN_TEXT = re.compile(r"\[standin:([^\]]*)\]")
TOOL_TRIGGER = "call "
UNFINISHED = "ASGI callable returned without completing response."  # uvicorn's, on a drop


@dataclass(frozen=True)
class StandinConfig:
    base_model: str = "standin-base"
    delay_ms: float = 0  # before every chat answer
    chunks: int = 4  # content pieces of a streamed answer
    chunk_delay_ms: float = 0
    max_model_len: int = 4096
    record_limit: int = 100_000  # requests kept (the oldest go first)


@dataclass(frozen=True)
class Fault:
    delay_ms: float | None = None
    status: int | None = None
    drop_after: int | None = None
    chunk_delay_ms: float | None = None
    is_hang: bool = False


@dataclass
class Reply:
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int

    def usage(self) -> dict[str, int]:
        total = self.prompt_tokens + self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": total,
        }


@dataclass
class StandinApp:
    """The ASGI app. `requests` holds what it received, newest last."""

    config: StandinConfig = field(default_factory=StandinConfig)
    adapters: dict[str, str] = field(default_factory=dict)  # name -> path
    requests: deque[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.requests = deque(maxlen=self.config.record_limit)
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
        }
        self.requests.append(record)
        route = self._routes.get((method, path))
        if route is not None:
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
        fault = read_fault(scope, request["messages"])
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
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls is not None:
            message["tool_calls"] = reply.tool_calls
        body = orjson.dumps(
            {
                "id": _completion_id(),
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": reply.finish_reason,
                    }
                ],
                "usage": reply.usage(),
            }
        )
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
                    await asyncio.sleep(delay_ms / 1000)
                if gone.is_set():
                    record["disconnected"] = True
                    return
                await send({"type": "http.response.body", "body": event, "more_body": True})
            watcher.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()


# Answers.
def compose_reply(request: dict[str, Any], model: str) -> Reply:
    messages = request["messages"]
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    prompt_tokens = sum(len(text_of(m).split()) for m in messages if isinstance(m, dict))
    if last.get("role") == "tool":
        content = f"reply from {model} to tool result: {text_of(last)}"
    else:
        user_text = text_of(last) if last.get("role") == "user" else last_user_text(messages)
        call = (
            tool_call_for(request.get("tools"), user_text) if last.get("role") == "user" else None
        )
        if call is not None:
            return Reply(
                None,
                [call],
                "tool_calls",
                prompt_tokens,
                len(call["function"]["arguments"].split()),
            )
        content = f"reply from {model} to: {user_text}"
    words = content.split(" ")
    limit = request.get("max_completion_tokens") or request.get("max_tokens")
    if isinstance(limit, int) and 0 < limit < len(words):
        return Reply(" ".join(words[:limit]), None, "length", prompt_tokens, limit)
    return Reply(content, None, "stop", prompt_tokens, len(words))


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def last_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return text_of(message)
    return ""


def tool_call_for(tools: Any, user_text: str) -> dict[str, Any] | None:
    """The call of the first tool whose `call <name>` the user text contains, if any."""
    if not isinstance(tools, list) or TOOL_TRIGGER not in user_text:
        return None
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            continue
        name = function.get("name")
        if isinstance(name, str) and f"{TOOL_TRIGGER}{name}" in user_text:
            arguments = sample_arguments(function.get("parameters"), user_text)
            return {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
            }
    return None


def sample_arguments(parameters: Any, user_text: str) -> dict[str, Any]:
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    samples = {"string": user_text, "integer": 1, "number": 1, "boolean": True}
    arguments: dict[str, Any] = {}
    for name, schema in (properties or {}).items():
        kind = schema.get("type") if isinstance(schema, dict) else None
        arguments[name] = samples.get(kind) if isinstance(kind, str) else None
    return arguments


def stream_events(model: str, reply: Reply, pieces: int, include_usage: bool) -> list[bytes]:
    """The SSE events of a streamed answer, `data: [DONE]` last."""
    head = {
        "id": _completion_id(),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**head, "choices": [choice], **({"usage": None} if include_usage else {})}

    chunks = [chunk({"role": "assistant", "content": "" if reply.content is not None else None})]
    if reply.tool_calls is not None:
        chunks.append(
            chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(reply.tool_calls)]})
        )
    else:
        chunks += [chunk({"content": piece}) for piece in split_text(reply.content or "", pieces)]
    chunks.append(chunk({}, reply.finish_reason))
    if include_usage:
        chunks.append({**head, "choices": [], "usage": reply.usage()})
    return [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


def split_text(text: str, pieces: int) -> list[str]:
    size = max(1, math.ceil(len(text) / max(1, pieces)))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def read_fault(scope: Scope, messages: list[Any]) -> Fault:
    fault = Fault()
    for name, value in scope["headers"]:
        if name == FAULT_HEADER:
            fault = parse_fault(value.decode("latin-1"), fault)
    text = last_user_text(messages)
    if "[standin:" in text:
        for spec in FAULT_IN_TEXT.findall(text):
            fault = parse_fault(spec, fault)
    return fault


def parse_fault(spec: str, fault: Fault) -> Fault:
    """`spec`'s directives laid over `fault`; unknown ones are ignored."""
    for token in re.split(r"[,\s]+", spec.strip()):
        key, _, value = token.partition("=")
        with contextlib.suppress(ValueError):
            if key == "hang":
                fault = replace(fault, is_hang=True)
            elif key == "delay-ms":
                fault = replace(fault, delay_ms=float(value))
            elif key == "status":
                fault = replace(fault, status=int(value))
            elif key == "drop-after":
                fault = replace(fault, drop_after=int(value))
            elif key == "chunk-delay-ms":
                fault = replace(fault, chunk_delay_ms=float(value))
    return fault


# ASGI plumbing.
def _completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


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
    args = parser.parse_args(argv)
    config = StandinConfig(
        base_model=args.base_model,
        delay_ms=args.delay_ms,
        chunks=args.chunks,
        chunk_delay_ms=args.chunk_delay_ms,
        record_limit=args.record_limit,
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

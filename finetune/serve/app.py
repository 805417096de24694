"""The local server's HTTP app and command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import finetune.serve
from finetune.serve.engine import (
    Engine,
    Finished,
    Job,
    QueueFull,
    Sampling,
    Scheduler,
    generation_loop,
    load_engine,
)
from finetune.serve.protocol import (
    ApiError,
    ChatRequest,
    LoadLoraRequest,
    UnloadLoraRequest,
    bad_request,
    not_found,
    parse_tool_calls,
    render_prompt,
    usage,
)

DEFAULT_MAX_TOKENS = 128
READY_LINE = "flywheel-serve listening on http://{host}:{port}"


# --- the app ----------------------------------------------------------------------------------


@dataclass
class Server:
    engine: Engine
    scheduler: Scheduler
    base_name: str
    max_tokens_cap: int

    def resolve(self, model: str) -> str | None:
        if model == self.base_name:
            return None
        if model in self.engine.adapters:
            return model
        raise not_found(f"The model `{model}` does not exist.")

    def job(self, body: ChatRequest) -> Job:
        adapter = self.resolve(body.model)
        prompt = render_prompt(self.engine.tokenizer, body)
        wanted = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
        room = (self.engine.context or len(prompt) + wanted) - len(prompt)
        if room < 1:
            raise bad_request(f"the prompt ({len(prompt)} tokens) fills the context", "messages")
        sampling = Sampling(body.temperature or 0.0, body.top_p or 1.0, body.ignore_eos)
        job = Job(adapter, prompt, min(wanted, room, self.max_tokens_cap), sampling,
                  body.stream and not body.tools, asyncio.get_running_loop())  # fmt: skip
        try:
            self.scheduler.submit(job)
        except QueueFull:
            raise ApiError(503, "the server's queue is full; retry later", type_="server_error",
                           code="server_overloaded") from None  # fmt: skip
        return job

    def message(self, body: ChatRequest, job: Job, done: Finished) -> tuple[dict[str, Any], str]:
        calls = None
        if body.tools:
            prefix = self.engine.tokenizer.decode(job.prompt, skip_special_tokens=False)
            calls = parse_tool_calls(self.engine.tokenizer, done.raw, prefix=prefix,
                                     tools=body.tools)  # fmt: skip
        if calls:
            return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"
        return {"role": "assistant", "content": done.content}, done.finish_reason


async def _events(job: Job) -> AsyncIterator[tuple[str, Any]]:
    while True:
        kind, payload = await job.events.get()
        if kind == "error":
            raise ApiError(500, payload, type_="server_error", code="generation_failed")
        yield kind, payload
        if kind == "done":
            return


async def _answer(job: Job, request: Request) -> Finished | None:
    """The finished answer, or None when the client left first (looked at 4 times a second)."""

    async def done() -> Finished:
        async for kind, payload in _events(job):
            if kind == "done":
                return payload  # type: ignore[no-any-return]
        raise AssertionError("no answer")

    waiter = asyncio.ensure_future(done())
    try:
        while True:
            finished, _ = await asyncio.wait({waiter}, timeout=0.25)
            if finished:
                return waiter.result()
            if await request.is_disconnected():
                return None
    finally:
        waiter.cancel()


async def complete(
    server: Server, body: ChatRequest, job: Job, request: Request
) -> dict[str, Any] | JSONResponse:
    try:
        done = await _answer(job, request)
    finally:
        server.scheduler.cancel(job)  # a no-op once finished; frees the row if the client left
    if done is None:  # nobody reads this
        return ApiError(499, "the client closed the request", type_="client_closed",
                        code="client_closed").response()  # fmt: skip
    message, reason = server.message(body, job, done)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
        "created": int(time.time()), "model": body.model,
        "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
        "usage": usage(len(job.prompt), done.completion_tokens),
    }  # fmt: skip


async def stream(server: Server, body: ChatRequest, job: Job) -> AsyncIterator[str]:
    """SSE chunks: the role, the text as it is generated, the finish reason, usage if asked."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": body.model}  # fmt: skip
    with_usage = body.stream_options is not None and body.stream_options.include_usage

    def chunk(delta: dict[str, Any], reason: str | None = None) -> str:
        extra = {"usage": None} if with_usage else {}
        choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
        return f"data: {json.dumps({**head, 'choices': [choice], **extra})}\n\n"

    try:
        yield chunk({"role": "assistant", "content": ""})
        sent = ""
        async for kind, payload in _events(job):
            if kind == "delta":
                sent += payload
                yield chunk({"content": payload})
                continue
            message, reason = server.message(body, job, payload)
            rest = {"content": payload.content[len(sent) :]} if message["content"] else {}
            if "tool_calls" in message:
                calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
                rest = {"tool_calls": calls}
            if rest.get("content") or rest.get("tool_calls"):
                yield chunk(rest)
            yield chunk({}, reason)
            if with_usage:
                total = usage(len(job.prompt), payload.completion_tokens)
                yield f"data: {json.dumps({**head, 'choices': [], 'usage': total})}\n\n"
    except ApiError as error:
        yield f"data: {json.dumps({'error': {'message': error.message, 'type': error.type, 'param': None, 'code': error.code}})}\n\n"  # noqa: E501
    finally:
        server.scheduler.cancel(job)
    yield "data: [DONE]\n\n"


def create_app(server: Server) -> FastAPI:
    app = FastAPI(title="flywheel-serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        cards = [_card(server.base_name, None)]
        cards += [_card(name, server.base_name) for name in list(server.engine.adapters)]
        return {"object": "list", "data": cards}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(
        body: ChatRequest, request: Request
    ) -> dict[str, Any] | JSONResponse | StreamingResponse:
        job = server.job(body)
        if body.stream:
            return StreamingResponse(stream(server, body, job), media_type="text/event-stream")
        return await complete(server, body, job, request)

    @app.post("/v1/load_lora_adapter")
    async def load(body: LoadLoraRequest) -> PlainTextResponse:
        await asyncio.to_thread(_load, server, body)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload(body: UnloadLoraRequest) -> PlainTextResponse:
        if body.lora_name not in server.engine.adapters:
            raise not_found(f"The lora adapter '{body.lora_name}' cannot be found.", "lora_name")
        await asyncio.to_thread(server.engine.unload_adapter, body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    @app.get("/metrics")
    async def metrics() -> dict[str, Any]:
        sizes = server.scheduler.batch_sizes
        return {
            **server.scheduler.counters,
            **server.engine.counters,
            "queued": server.scheduler.depth(),
            "batches": sum(sizes.values()),
            "max_batch_size": max(sizes, default=0),
            "batch_sizes": {str(size): count for size, count in sorted(sizes.items())},
        }

    return app


def _card(name: str, parent: str | None) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "flywheel", "parent": parent}


def _load(server: Server, body: LoadLoraRequest) -> None:
    """vLLM's checks and answers: both fields, a new name (400), a directory with an
    adapter (404 when none), one that loads onto this base (400)."""
    if not body.lora_name or not body.lora_path:
        raise bad_request("Both 'lora_name' and 'lora_path' must be provided.")
    if body.lora_name in server.engine.adapters or body.lora_name == server.base_name:
        raise bad_request(f"The lora adapter '{body.lora_name}' has already been loaded.",
                           "lora_name")  # fmt: skip
    if not (Path(body.lora_path) / "adapter_config.json").is_file():
        raise not_found(f"No adapter found for {body.lora_path}", "lora_path")
    try:
        server.engine.load_adapter(body.lora_name, body.lora_path)
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        raise bad_request(f"cannot load the adapter: {error}", "lora_path") from error


async def _api_error(_request: Any, error: ApiError) -> JSONResponse:
    return error.response()


async def _validation_error(_request: Any, error: RequestValidationError) -> JSONResponse:
    first = error.errors()[0] if error.errors() else {}
    path = ".".join(str(part) for part in first.get("loc", ())[1:] if isinstance(part, str))
    message = f"{path or 'body'}: {first.get('msg', 'invalid request')}"
    return bad_request(message, path or None).response()


async def _http_error(_request: Any, error: StarletteHTTPException) -> JSONResponse:
    code = "not_found" if error.status_code == 404 else "invalid_request"
    return ApiError(error.status_code, str(error.detail), type_="invalid_request_error",
                    code=code).response()  # fmt: skip


# --- command line -----------------------------------------------------------------------------


class _ReadyServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, ready: str) -> None:
        super().__init__(config)
        self.ready = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            print(self.ready, flush=True)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m finetune.serve",
        description=finetune.serve.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--base-model", type=Path, required=True, help="A model directory.")
    parser.add_argument("--served-model-name", help="The base's name (default: --base-model).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: a free port.")
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--max-queue", type=int, default=256, help="Queued requests; then 503.")
    parser.add_argument("--max-tokens-cap", type=int, default=2048)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    engine = load_engine(args.base_model, args.device, args.dtype)
    scheduler = Scheduler(max_batch=args.max_batch_size, wait_s=args.batch_wait_ms / 1000,
                          max_queue=args.max_queue)  # fmt: skip
    name = args.served_model_name or str(args.base_model)
    server = Server(engine, scheduler, name, args.max_tokens_cap)
    threading.Thread(target=generation_loop, args=(scheduler, engine), daemon=True).start()
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(server), log_level="warning", access_log=False, timeout_graceful_shutdown=5
    )
    _ReadyServer(config, READY_LINE.format(host=args.host, port=port)).run(sockets=[sock])

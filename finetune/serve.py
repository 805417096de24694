"""`python -m finetune.serve --base-model DIR [--port 0]`: the embedded inference server.

A base model (transformers) and the LoRA adapters loaded into it by name (peft), served over
the OpenAI-compatible subset vLLM speaks: `GET /v1/models`, `POST /v1/chat/completions`
(streamed or not), `POST /v1/load_lora_adapter`, `POST /v1/unload_lora_adapter`, plus
`GET /health` and `GET /metrics` (JSON counters, batch sizes among them).

Requests wait in a bounded queue (503 when full). One generation thread takes up to
`--max-batch-size` queued requests for the adapter of the oldest one (so no adapter starves),
left-pads them and runs `model.generate` once for the group. Streaming is incremental: a
stopping criterion sees every step's tokens, hands each row's new text to its request, and
stops rows that finished or whose client went away (the rest of the batch runs on).

Once it serves it prints one line on stdout: `flywheel-serve listening on http://HOST:PORT`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from peft import PeftModel
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    StoppingCriteria,
    StoppingCriteriaList,
)

DEFAULT_MAX_TOKENS = 128
READY_LINE = "flywheel-serve listening on http://{host}:{port}"
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


# --- errors, in OpenAI's shape ---------------------------------------------------------------


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, *, type_: str, code: str, param: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = (
            status, message, type_, code, param,
        )  # fmt: skip

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return JSONResponse({"error": error}, status_code=self.status)


def _bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, type_="invalid_request_error", code="invalid_value", param=param)


def _not_found(message: str, param: str | None = "model") -> ApiError:
    return ApiError(
        404, message, type_="invalid_request_error", code="model_not_found", param=param
    )


# --- request bodies ---------------------------------------------------------------------------


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    """The fields of OpenAI's chat body this server honours; others are ignored (as vLLM)."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[dict[str, Any]] | None = None
    ignore_eos: bool = False


class LoadLoraRequest(BaseModel):
    lora_name: str = ""
    lora_path: str = ""


class UnloadLoraRequest(BaseModel):
    lora_name: str = ""


# --- jobs and the batching queue --------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    temperature: float  # 0: greedy
    top_p: float
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens whatever the model says


@dataclass(frozen=True)
class Finished:
    content: str
    raw: str  # with special tokens: what a tool-call parser reads
    finish_reason: Literal["stop", "length"]
    completion_tokens: int


@dataclass(eq=False)
class Job:
    """One request: its prompt, its limits, and the channel the generation thread answers on
    (`("delta", str)` while streaming, then `("done", Finished)` or `("error", str)`)."""

    adapter: str | None
    prompt: list[int]
    max_tokens: int
    sampling: Sampling
    stream: bool
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    tokens: list[int] = field(default_factory=list)
    sent: str = ""
    cancelled: bool = False
    finished: bool = False

    @property
    def key(self) -> tuple[str | None, Sampling]:
        return self.adapter, self.sampling

    def emit(self, kind: str, payload: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))


class QueueFull(Exception):
    pass


class Scheduler:
    """The bounded queue, and the batches taken from it: the oldest request's (adapter,
    sampling) first, up to `max_batch` of them, after waiting up to `wait_s` for it to fill."""

    def __init__(self, *, max_batch: int, wait_s: float, max_queue: int) -> None:
        self.max_batch, self.wait_s, self.max_queue = max_batch, wait_s, max_queue
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self.counters: Counter[str] = Counter()
        self.batch_sizes: Counter[int] = Counter()

    def submit(self, job: Job) -> None:
        with self._cond:
            if len(self._queue) >= self.max_queue:
                self.counters["rejected"] += 1
                raise QueueFull
            self._queue.append(job)
            self.counters["requests"] += 1
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """The client is gone: out of the queue, or marked so its batch stops its row."""
        with self._cond:
            if job.finished or job.cancelled:
                return
            job.cancelled = True
            self.counters["cancelled"] += 1
            if job in self._queue:
                self._queue.remove(job)

    def depth(self) -> int:
        with self._cond:
            return len(self._queue)

    def next_batch(self) -> list[Job]:
        with self._cond:
            while not self._queue:
                self._cond.wait()
            deadline = time.monotonic() + self.wait_s
            while self._queue and self._count(self._queue[0].key) < self.max_batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if not self._queue:
                return []
            key = self._queue[0].key
            batch = [job for job in self._queue if job.key == key][: self.max_batch]
            for job in batch:
                self._queue.remove(job)
            self.batch_sizes[len(batch)] += 1
            return batch

    def _count(self, key: tuple[str | None, Sampling]) -> int:
        return sum(1 for job in self._queue if job.key == key)


# --- the model --------------------------------------------------------------------------------


class Engine:
    """The base model and its adapters; only one thread at a time generates or changes them."""

    def __init__(self, model: Any, tokenizer: Any, device: torch.device) -> None:
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.lock = threading.Lock()
        self.adapters: dict[str, str] = {}
        self.counters: Counter[str] = Counter()
        stops = model.generation_config.eos_token_id
        stops = [stops] if isinstance(stops, int) else list(stops or [])
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in stops:
            stops.append(tokenizer.eos_token_id)
        self.stop_ids = frozenset(stops)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
        self.context = getattr(model.config, "max_position_embeddings", None)

    def load_adapter(self, name: str, path: str) -> None:
        with self.lock:
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(path, adapter_name=name)
            else:
                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
            self.model.eval()
            self.adapters[name] = path

    def unload_adapter(self, name: str) -> None:
        with self.lock:
            self.model.delete_adapter(name)
            del self.adapters[name]
            if not self.adapters:
                self.model = self.model.unload()

    def _adapter(self, name: str | None) -> AbstractContextManager[Any]:
        if name is None:
            if isinstance(self.model, PeftModel):
                return self.model.disable_adapter()  # type: ignore[no-any-return]
            return nullcontext()
        if name not in self.adapters:
            raise KeyError(f"The model `{name}` does not exist.")
        self.model.set_adapter(name)
        return nullcontext()

    def run(self, batch: Sequence[Job]) -> None:
        """One `generate` for the batch (same adapter, same sampling), left-padded."""
        width = max(len(job.prompt) for job in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, job in enumerate(batch):
            ids[row, width - len(job.prompt) :] = torch.tensor(job.prompt)
            mask[row, width - len(job.prompt) :] = 1
        rows = _Rows(batch, self)
        with self.lock, torch.inference_mode(), self._adapter(batch[0].adapter):
            self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                stopping_criteria=StoppingCriteriaList([rows]),
                generation_config=self._config(batch),
            )
        rows.finish_all()

    def finish(self, job: Job, reason: Literal["stop", "length"]) -> None:
        content_ids = job.tokens[:-1] if reason == "stop" else job.tokens
        content = self.tokenizer.decode(content_ids, skip_special_tokens=True)
        raw = self.tokenizer.decode(content_ids, skip_special_tokens=False)
        job.finished = True
        self.counters["completion_tokens"] += len(job.tokens)
        job.emit("done", Finished(content, raw, reason, len(job.tokens)))

    def stream_delta(self, job: Job) -> None:
        text = self.tokenizer.decode(job.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(job.sent):
            return  # a character still incomplete: wait for its next byte
        if len(text) > len(job.sent):
            job.emit("delta", text[len(job.sent) :])
            job.sent = text

    def _config(self, batch: Sequence[Job]) -> GenerationConfig:
        """The model's generation config with the batch's sampling (and no eos if ignored)."""
        config = copy.deepcopy(self.model.generation_config)
        config.update(max_new_tokens=max(job.max_tokens for job in batch), pad_token_id=self.pad_id)
        return _with_sampling(config, batch[0].sampling)


def _with_sampling(config: GenerationConfig, sampling: Sampling) -> GenerationConfig:
    if sampling.ignore_eos:
        config.eos_token_id = []  # None would fall back to the model's
    if sampling.temperature == 0:
        config.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        config.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                      top_k=0)  # fmt: skip
    return config


class _Rows(StoppingCriteria):
    """Each step: every live row's new token goes to its job (streamed as text when asked);
    a row stops on a stop token, at its own `max_tokens`, or when its client is gone."""

    def __init__(self, jobs: Sequence[Job], engine: Engine) -> None:
        self.jobs, self.engine = jobs, engine
        self.done = [False] * len(jobs)

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        for row, token in enumerate(input_ids[:, -1].tolist()):
            if not self.done[row]:
                self._step(row, token)
        return torch.tensor(self.done, device=input_ids.device)

    def _step(self, row: int, token: int) -> None:
        job = self.jobs[row]
        if job.cancelled:
            self.done[row] = True
            self.engine.counters["dropped"] += 1  # its client left: the batch runs on without it
            return
        job.tokens.append(token)
        stop = token in self.engine.stop_ids and not job.sampling.ignore_eos
        if stop or len(job.tokens) >= job.max_tokens:
            self.done[row] = True
            self.engine.finish(job, "stop" if stop else "length")
        elif job.stream:
            self.engine.stream_delta(job)

    def finish_all(self) -> None:
        for row, job in enumerate(self.jobs):
            if not self.done[row] and not job.cancelled:
                self.engine.finish(job, "length")


def generation_loop(scheduler: Scheduler, engine: Engine) -> None:
    while True:
        batch = scheduler.next_batch()
        if not batch:
            continue
        try:
            engine.run(batch)
        except Exception as error:  # a failed batch fails its requests, never the thread
            for job in batch:
                if not job.finished:
                    job.finished = True
                    job.emit("error", f"{type(error).__name__}: {error}")


# --- prompts and answers ----------------------------------------------------------------------


def render_prompt(tokenizer: Any, body: ChatRequest) -> list[int]:
    """The chat template's prompt (with `tools` when given), tokenized."""
    messages = [_template_message(message) for message in body.messages]
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=body.tools, add_generation_prompt=True, tokenize=False
        )
    except Exception as error:  # jinja's errors: the messages do not fit the template
        raise _bad_request(f"cannot render the messages: {error}", "messages") from error
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's message as chat templates read it: text parts joined, tool-call arguments
    as objects rather than JSON strings."""
    message = dict(message)
    if isinstance(message.get("content"), list):
        parts = message["content"]
        message["content"] = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
    calls = []
    for call in message.get("tool_calls") or []:
        function = dict(call.get("function", {}))
        if isinstance(function.get("arguments"), str):
            with suppress(json.JSONDecodeError):
                function["arguments"] = json.loads(function["arguments"])
        calls.append({**call, "function": function})
    if calls:
        message["tool_calls"] = calls
    return message


def parse_tool_calls(
    tokenizer: Any, text: str, *, prefix: str = "", tools: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]] | None:
    """OpenAI tool calls in generated `text` (after the prompt `prefix`), or None: the
    tokenizer's own response parser when it has one for its template (TRL sets those of the
    templates it ships), else `<tool_call>{json}</tool_call>` blocks."""
    if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None):
        try:
            if getattr(tokenizer, "response_template", None):
                parsed = tokenizer.parse_response(text, prefix=prefix, tools=tools)
            else:
                parsed = tokenizer.parse_response(text)
            calls = (parsed or {}).get("tool_calls") or []
        except (ValueError, TypeError, KeyError):
            return None
    else:
        try:
            calls = [{"function": json.loads(block)} for block in _TOOL_CALL.findall(text)]
        except json.JSONDecodeError:
            return None
    functions = [call.get("function", call) for call in calls if isinstance(call, dict)]
    if not functions or not all(isinstance(f.get("name"), str) for f in functions):
        return None
    return [
        {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
         "function": {"name": f["name"], "arguments": _arguments(f.get("arguments"))}}
        for f in functions
    ]  # fmt: skip


def _arguments(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments or {})


def _add_response_parser(tokenizer: Any) -> None:
    """TRL knows the response parsers of the templates it ships; others keep the fallback."""
    if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None):
        return
    try:
        from trl.chat_template_utils import add_response_schema

        add_response_schema(tokenizer)
    except (ImportError, ValueError):
        pass


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip


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
        raise _not_found(f"The model `{model}` does not exist.")

    def job(self, body: ChatRequest) -> Job:
        adapter = self.resolve(body.model)
        prompt = render_prompt(self.engine.tokenizer, body)
        wanted = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
        room = (self.engine.context or len(prompt) + wanted) - len(prompt)
        if room < 1:
            raise _bad_request(f"the prompt ({len(prompt)} tokens) fills the context", "messages")
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


async def complete(server: Server, body: ChatRequest, job: Job) -> dict[str, Any]:
    try:
        async for kind, payload in _events(job):
            if kind == "done":
                done: Finished = payload
    finally:
        server.scheduler.cancel(job)  # a no-op once finished; frees the row if we were cancelled
    message, reason = server.message(body, job, done)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
        "created": int(time.time()), "model": body.model,
        "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
        "usage": _usage(len(job.prompt), done.completion_tokens),
    }  # fmt: skip


async def stream(server: Server, body: ChatRequest, job: Job) -> AsyncIterator[str]:
    """SSE chunks: the role, the text as it is generated, the finish reason, usage if asked."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": body.model}  # fmt: skip
    usage = body.stream_options is not None and body.stream_options.include_usage

    def chunk(delta: dict[str, Any], reason: str | None = None) -> str:
        extra = {"usage": None} if usage else {}
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
            if usage:
                total = _usage(len(job.prompt), payload.completion_tokens)
                yield f"data: {json.dumps({**head, 'choices': [], 'usage': total})}\n\n"
    except ApiError as error:
        yield f"data: {json.dumps({'error': {'message': error.message, 'type': error.type, 'param': None, 'code': error.code}})}\n\n"  # noqa: E501
    finally:
        server.scheduler.cancel(job)
    yield "data: [DONE]\n\n"


def create_app(server: Server) -> FastAPI:
    app = FastAPI(title="flywheel-serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(ApiError, lambda _r, e: e.response())  # type: ignore[arg-type, return-value]
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
    async def chat(body: ChatRequest) -> dict[str, Any] | StreamingResponse:
        job = server.job(body)
        if body.stream:
            return StreamingResponse(stream(server, body, job), media_type="text/event-stream")
        return await complete(server, body, job)

    @app.post("/v1/load_lora_adapter")
    async def load(body: LoadLoraRequest) -> PlainTextResponse:
        await asyncio.to_thread(_load, server, body)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload(body: UnloadLoraRequest) -> PlainTextResponse:
        if body.lora_name not in server.engine.adapters:
            raise _not_found(f"The lora adapter '{body.lora_name}' cannot be found.", "lora_name")
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
        raise _bad_request("Both 'lora_name' and 'lora_path' must be provided.")
    if body.lora_name in server.engine.adapters or body.lora_name == server.base_name:
        raise _bad_request(f"The lora adapter '{body.lora_name}' has already been loaded.",
                           "lora_name")  # fmt: skip
    if not (Path(body.lora_path) / "adapter_config.json").is_file():
        raise _not_found(f"No adapter found for {body.lora_path}", "lora_path")
    try:
        server.engine.load_adapter(body.lora_name, body.lora_path)
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        raise _bad_request(f"cannot load the adapter: {error}", "lora_path") from error


async def _validation_error(_request: Any, error: RequestValidationError) -> JSONResponse:
    first = error.errors()[0] if error.errors() else {}
    where = ".".join(str(part) for part in first.get("loc", ())[1:] if isinstance(part, str))
    where = where or None
    message = f"{where or 'body'}: {first.get('msg', 'invalid request')}"
    return _bad_request(message, where).response()


async def _http_error(_request: Any, error: StarletteHTTPException) -> JSONResponse:
    code = "not_found" if error.status_code == 404 else "invalid_request"
    return ApiError(error.status_code, str(error.detail), type_="invalid_request_error",
                    code=code).response()  # fmt: skip


# --- command line -----------------------------------------------------------------------------


def load_engine(base: Path, device: str, dtype: str) -> Engine:
    where = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                         "cpu" if device == "auto" else device)  # fmt: skip
    if dtype == "auto":
        bf16 = where.type == "cuda" and torch.cuda.is_bf16_supported()
        dtype = "bfloat16" if bf16 else "float32"
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype)).to(where)
    model.eval()
    if tokenizer.chat_template is None:
        raise SystemExit(f"the tokenizer in {base} has no chat template")
    _add_response_parser(tokenizer)
    return Engine(model, tokenizer, where)


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
        description=__doc__,
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
    config = uvicorn.Config(create_app(server), log_level="warning", access_log=False)
    _ReadyServer(config, READY_LINE.format(host=args.host, port=port)).run(sockets=[sock])


if __name__ == "__main__":
    main()

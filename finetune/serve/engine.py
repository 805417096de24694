"""The local server's model and its batching: the bounded queue, batches per adapter, one
`generate` per batch with per-row stops and incremental text."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from peft import PeftModel
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    StoppingCriteria,
    StoppingCriteriaList,
)

from finetune.serve.protocol import add_response_parser

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
        self.adapters: dict[str, str] = {}  # served name -> its directory
        # served name -> peft's name for it: peft names are module names (no "."), served
        # names are the registry's (`acme.billing-v3`)
        self.slots: dict[str, str] = {}
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
            self.counters["adapters_loaded"] += 1
            slot = f"adapter_{self.counters['adapters_loaded']}"
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(path, adapter_name=slot)
            else:
                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=slot)
            self.model.eval()
            self.adapters[name] = path
            self.slots[name] = slot

    def unload_adapter(self, name: str) -> None:
        with self.lock:
            self.model.delete_adapter(self.slots.pop(name))
            del self.adapters[name]
            if not self.adapters:
                self.model = self.model.unload()

    def _adapter(self, name: str | None) -> AbstractContextManager[Any]:
        if name is None:
            if isinstance(self.model, PeftModel):
                return self.model.disable_adapter()
            return nullcontext()
        if name not in self.adapters:
            raise KeyError(f"The model `{name}` does not exist.")
        self.model.set_adapter(self.slots[name])
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
    greedy = sampling.temperature == 0
    config.do_sample = not greedy
    config.temperature = None if greedy else sampling.temperature
    config.top_p = None if greedy else sampling.top_p
    config.top_k = None if greedy else 0  # OpenAI's API has no top-k
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


def load_engine(base: Path, device: str, dtype: str) -> Engine:
    where = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                         "cpu" if device == "auto" else device)  # fmt: skip
    if dtype == "auto":
        bf16 = where.type == "cuda" and torch.cuda.is_bf16_supported()
        dtype = "bfloat16" if bf16 else "float32"
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.padding_side = "left"
    model: Any = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype))
    model.to(where)
    model.eval()
    if tokenizer.chat_template is None:
        raise SystemExit(f"the tokenizer in {base} has no chat template")
    add_response_parser(tokenizer)
    return Engine(model, tokenizer, where)

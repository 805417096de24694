"""The one interface every inference backend speaks, and its errors.

A backend is an OpenAI-compatible chat server that serves LoRA adapters by name: vLLM
(`--enable-lora`), SGLang, LoRAX, or `python -m finetune.serve` (the local transformers + peft
server the embedded setup starts). The gateway never speaks any other protocol: a request body
is OpenAI's `chat.completions` body, a response is OpenAI's `chat.completion` object, a stream
is OpenAI's `chat.completion.chunk` objects.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

FailureKind = Literal["timeout", "upstream_error", "dropped", "unavailable"]


class BackendError(Exception):
    """The upstream failed: timed out (504), answered an error, dropped the stream or could
    not be reached (502). `message` is safe to show to the caller (no upstream secrets)."""

    def __init__(self, kind: FailureKind, message: str, *, upstream_status: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.upstream_status = upstream_status

    @property
    def status(self) -> int:
        return 504 if self.kind == "timeout" else 502


@dataclass(frozen=True)
class Adapter:
    """A registered adapter version as a backend loads it: `name` is what requests address
    (unique per registered model and version, e.g. `acme.billing-v3`), `path` a local
    directory holding the adapter's files (downloaded from the registry)."""

    name: str
    path: Path


class ChatBackend(Protocol):
    """Chat completions against the base model (`adapter=None`) or one loaded adapter."""

    @property
    def base_model(self) -> str:
        """The name the upstream serves its base model under (the `model` of a base call)."""
        ...

    async def ensure_adapter(self, adapter: Adapter) -> None:
        """Make `adapter` servable (load it dynamically where the upstream can); idempotent
        and cheap once loaded. BackendError when the upstream refuses it."""
        ...

    async def complete(self, body: dict[str, Any], adapter: Adapter | None) -> dict[str, Any]:
        """One non-streamed `chat.completion`; `body["model"]` is replaced by the backend."""
        ...

    def stream(
        self, body: dict[str, Any], adapter: Adapter | None
    ) -> AsyncIterator[dict[str, Any]]:
        """The `chat.completion.chunk` objects of a streamed completion, as they arrive.
        Closing the iterator early (`aclose()`, a client gone) cancels the upstream request."""
        ...

    async def aclose(self) -> None:
        """Release connections (and stop a process the backend started)."""
        ...

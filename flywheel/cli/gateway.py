"""`flywheel gateway`: the OpenAI-compatible gateway (uvicorn, `flywheel serve`'s protocol)."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

import typer

from flywheel.cli.common import JsonOption, emit, settings
from flywheel.errors import InvalidInput

if TYPE_CHECKING:
    from flywheel.inference.local import LocalServer


def gateway(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8100, min=1, max=65535, help="Port to listen on."),
    workers: int = typer.Option(1, min=1, help="Server processes."),
    backend: str = typer.Option(
        "openai",
        help="openai: an OpenAI-compatible upstream at --upstream-url (vLLM, SGLang, LoRAX); "
        "local: start `python -m finetune.serve` on --base-model and stop it on exit.",
    ),
    upstream_url: str | None = typer.Option(
        None, help="The upstream's base URL, e.g. http://vllm:8000/v1 (backend openai)."
    ),
    upstream_key_env: str | None = typer.Option(
        None, help="Name of the environment variable holding the upstream's API key."
    ),
    dynamic_lora: bool = typer.Option(
        True,
        "--dynamic-lora/--no-dynamic-lora",
        help="Load adapters into the upstream on first use (vLLM's load_lora_adapter); off: "
        "the upstream serves them already, named <registered model>-v<version>.",
    ),
    base_model: str | None = typer.Option(
        None,
        help="backend openai: the upstream's base model name (default: the first it lists); "
        "backend local: the base model directory (default FLYWHEEL_BASE_MODEL).",
    ),
    access_log: bool = typer.Option(True, help="Log every request (uvicorn's access log)."),
    as_json: bool = JsonOption,
) -> None:
    """Serve OpenAI's chat completions API from each domain's champion, canary and versions,
    recording every call, until interrupted."""
    from flywheel.cli.server import _run_uvicorn, require_current_schema

    if backend not in ("openai", "local"):
        raise InvalidInput(f"--backend must be openai or local, not {backend!r}")
    current = settings()
    secret = _secret_from(upstream_key_env) if upstream_key_env else None
    if backend == "openai" and not (upstream_url or current.gateway_upstream_url):
        raise InvalidInput("--upstream-url (or FLYWHEEL_GATEWAY_UPSTREAM_URL) is required")
    revision = require_current_schema(current)
    server = _start_local(base_model or current.base_model) if backend == "local" else None
    upstream_url = server.base_url if server else upstream_url or current.gateway_upstream_url
    exports = {"UPSTREAM_URL": str(upstream_url), "DYNAMIC_LORA": str(dynamic_lora).lower()}
    if secret is not None:
        exports["UPSTREAM_KEY"] = secret
    if base_model and server is None:
        exports["BASE_MODEL"] = base_model
    for name, value in exports.items():  # each uvicorn worker builds its app from them
        os.environ[f"FLYWHEEL_GATEWAY_{name}"] = value
    url = f"http://{host}:{port}/v1"
    data = {"url": url, "workers": workers, "upstream": upstream_url, "revision": revision}
    emit(data, as_json=as_json, text=f"gateway {url} -> {upstream_url}; Ctrl-C stops")
    if server is not None:
        # uvicorn ends a SIGTERMed server by re-raising SIGTERM once it has shut down; with
        # the default handler that kills this process before `finally` stops the local
        # server. Raised as SystemExit instead, `finally` runs.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        _run_uvicorn(
            settings(),
            host,
            port,
            workers,
            access_log=access_log,
            as_json=as_json,
            factory="api.gateway:create_gateway_app",
        )
    finally:
        if server is not None:
            server.stop()


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _secret_from(variable: str) -> str:
    value = os.environ.get(variable)
    if not value:
        raise InvalidInput(f"--upstream-key-env {variable}: that variable is not set")
    return value


def _start_local(base_model: object) -> LocalServer:
    from flywheel.inference.local import LocalServer, serve_command

    if not base_model:
        raise InvalidInput("--backend local needs --base-model DIR (or FLYWHEEL_BASE_MODEL)")
    server = LocalServer(serve_command(str(base_model)))
    server.start()
    return server

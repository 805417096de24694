"""`flywheel gateway`: the OpenAI-compatible gateway (uvicorn, `flywheel serve`'s protocol)."""

from __future__ import annotations

import os
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
    revision = require_current_schema(current)
    _export("DYNAMIC_LORA", "true" if dynamic_lora else "false")
    if upstream_key_env:
        _export("UPSTREAM_KEY", _secret_from(upstream_key_env))
    server = None
    if backend == "local":
        server = _start_local(base_model or current.base_model)
        upstream_url = server.base_url
    elif base_model:
        _export("BASE_MODEL", base_model)
    upstream_url = upstream_url or current.gateway_upstream_url
    if not upstream_url:
        raise InvalidInput("--upstream-url (or FLYWHEEL_GATEWAY_UPSTREAM_URL) is required")
    _export("UPSTREAM_URL", upstream_url)
    url = f"http://{host}:{port}/v1"
    data = {"url": url, "workers": workers, "upstream": upstream_url, "revision": revision}
    emit(data, as_json=as_json, text=f"gateway {url} -> {upstream_url}; Ctrl-C stops")
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


def _export(name: str, value: str) -> None:
    """Each uvicorn worker builds its app from the FLYWHEEL_* environment."""
    os.environ[f"FLYWHEEL_GATEWAY_{name}"] = value


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

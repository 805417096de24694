"""`flywheel train`: export a dataset version, run the recipe in a subprocess, record the run,
register the adapter as the domain's `challenger`.

The trainer runs as a subprocess (`python -m finetune`, or `accelerate launch` on several
GPUs) so that an out-of-memory error or a CUDA crash never takes the caller down, and so that
a training host needs no database credentials. Its stderr (progress, warnings) is passed
through as it comes; its last stdout line is the outcome (MLflow run id, adapter).

A run's directory, `<workspace>/runs/<training run id>/`, holds the export (`dataset/`), the
checkpoints and the adapter (`job/`).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sqlalchemy.orm import Session, sessionmaker

from flywheel.children import die_with_parent
from flywheel.datasets.models import DatasetVersion
from flywheel.datasets.reader import export_dataset_version, refuse_tainted
from flywheel.datasets.versions import latest_version
from flywheel.db import unit_of_work, utcnow
from flywheel.errors import InvalidInput, NotFound
from flywheel.observability import subprocess_output
from flywheel.registry.mlflow_registry import MlflowRegistry
from flywheel.registry.models import Run
from flywheel.registry.service import register_version
from flywheel.settings import Settings
from flywheel.tenancy.models import Domain

METHODS = ("sft", "dpo", "kto", "grpo")
INTERRUPTED_EXIT = 75  # finetune's "stopped on SIGTERM, checkpointed"


@dataclass(frozen=True)
class TrainRequest:
    domain: Domain  # looked up once by the caller
    method: str
    dataset_version_id: uuid.UUID | None = None  # None: the latest untainted version
    base: Path | None = None  # None: the domain's `base_model`, then FLYWHEEL_BASE_MODEL
    config: Path | None = None
    overrides: tuple[str, ...] = ()
    gpus: int = 1


@dataclass(frozen=True)
class TrainResult:
    run_id: uuid.UUID
    status: str
    mlflow_run_id: str | None
    adapter_uri: str | None
    run_dir: Path
    error: str | None = None
    model_version: str | None = None  # the registered adapter (alias `challenger`)
    exit_code: int | None = None  # the trainer's; 2: it refused its input (config, export, base)

    def as_json(self) -> dict[str, Any]:
        return {
            "training_run_id": str(self.run_id),
            "status": self.status,
            "mlflow_run_id": self.mlflow_run_id,
            "adapter_uri": self.adapter_uri,
            "run_dir": str(self.run_dir),
            "error": self.error,
            "model_version": self.model_version,
        }


def train(
    sessions: sessionmaker[Session],
    request: TrainRequest,
    settings: Settings,
    *,
    should_stop: Callable[[], bool] | None = None,
) -> TrainResult:
    """Export, train, record: the run row is `running` while the subprocess works, then
    `succeeded`, `failed` or `cancelled` (stopped by SIGTERM — ours, or when `should_stop`,
    polled every second, says so; its checkpoints remain)."""
    if request.method not in METHODS:
        raise InvalidInput(f"unknown training method {request.method!r}: sft, dpo, kto or grpo")
    if request.gpus < 1:
        raise InvalidInput(f"--gpus must be at least 1, not {request.gpus}")
    with unit_of_work(sessions) as session:
        domain = request.domain
        version = _version(session, request)
        base = _base(request, domain, settings)
        run = _start_run(session, request, version, base)
        run_dir = (settings.home / "runs" / str(run.id)).resolve()
        export_dataset_version(session, version, domain.name, run_dir / "dataset", "trl")
    command = _command(request, run_dir, base)
    code, outcome, error = _run(command, should_stop)
    # stopped by a SIGTERM: checkpointed (75), or before its handler was installed (-15)
    stopped = code in (INTERRUPTED_EXIT, -signal.SIGTERM)
    status = "succeeded" if code == 0 else "cancelled" if stopped else "failed"
    adapter_uri = (outcome or {}).get("adapter_uri")
    with unit_of_work(sessions) as session:
        row = session.get_one(Run, run.id)
        row.status = status
        row.finished_at = utcnow()
        row.mlflow_run_id = (outcome or {}).get("mlflow_run_id")
        row.error = None if code == 0 else error or f"the trainer exited with status {code}"
    registered_as: str | None = None
    if status == "succeeded" and adapter_uri:
        with unit_of_work(sessions) as session:  # its own step: a trained run stays recorded
            registered = register_version(
                session=session,
                registry=MlflowRegistry(settings.resolved_mlflow_tracking_uri),
                run=session.get_one(Run, run.id),
                adapter_uri=adapter_uri,
                base_model=str(base),
            )
            registered_as = registered.version
    return TrainResult(
        run.id,
        status,
        (outcome or {}).get("mlflow_run_id"),
        adapter_uri,
        run_dir,
        None if code == 0 else row.error,
        model_version=registered_as,
        exit_code=code,
    )


def _version(session: Session, request: TrainRequest) -> DatasetVersion:
    """The requested version of the domain, or its latest untainted one."""
    name = request.domain.name
    if request.dataset_version_id is None:
        version = latest_version(session=session, domain_id=request.domain.id, is_untainted=True)
        if version is None:
            raise NotFound(
                f"domain {name!r} has no untainted dataset version: "
                f"flywheel dataset build --domain {name}"
            )
        return version
    found = session.get(DatasetVersion, request.dataset_version_id)
    if found is None or found.domain_id != request.domain.id:
        raise NotFound(f"dataset version {request.dataset_version_id} not found in {name}")
    refuse_tainted(found, name)
    return found


def _base(request: TrainRequest, domain: Domain, settings: Settings) -> Path:
    configured = domain.config.get("base_model") if isinstance(domain.config, dict) else None
    base = request.base or (Path(str(configured)) if configured else settings.base_model)
    if base is None:
        raise InvalidInput(
            "no base model: pass --base DIR, set the domain's base_model or FLYWHEEL_BASE_MODEL"
        )
    if not (base / "config.json").is_file():
        raise InvalidInput(f"{base} is not a model directory (no config.json)")
    return base.resolve()


def _start_run(session: Session, request: TrainRequest, version: DatasetVersion, base: Path) -> Run:
    config: dict[str, Any] = {
        "base": str(base),
        "config_file": str(request.config) if request.config else None,
        "config_text": request.config.read_text(encoding="utf-8") if request.config else None,
        "overrides": list(request.overrides),
        "gpus": request.gpus,
    }
    run = Run(
        tenant_id=version.tenant_id,
        domain_id=version.domain_id,
        dataset_version_id=version.id,
        method=request.method,
        config=config,
        config_sha256=hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest(),
        status="running",
        started_at=utcnow(),
    )
    session.add(run)
    session.flush()
    return run


def _command(request: TrainRequest, run_dir: Path, base: Path) -> list[str]:
    launcher = [sys.executable, "-m"]
    if request.gpus > 1:
        launcher = [sys.executable, "-m", "accelerate.commands.launch"]
        launcher += ["--num_processes", str(request.gpus), "-m"]
    arguments = ["finetune", request.method, "--dataset", str(run_dir / "dataset")]
    arguments += ["--base", str(base), "--out", str(run_dir / "job")]
    if request.config is not None:
        arguments += ["--config", str(request.config.resolve())]
    return [*launcher, *arguments, *request.overrides]


def _run(
    command: Sequence[str], should_stop: Callable[[], bool] | None = None
) -> tuple[int, dict[str, Any] | None, str | None]:
    """Run the trainer with both of its streams passed through to our stderr as they come
    (progress bars included); keep its last stderr line (a bad-input error is one line) and
    read its last stdout line as the outcome. When `should_stop` turns true the trainer gets
    a SIGTERM: it checkpoints and exits with INTERRUPTED_EXIT."""
    last_out: list[str] = []
    last_err: list[str] = []
    # A SIGTERM when this process dies (a killed worker): the trainer checkpoints and exits
    # instead of training on unowned.
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=die_with_parent()
    ) as child:
        relays = [
            threading.Thread(target=_relay, args=(child.stdout, last_out), daemon=True),
            threading.Thread(target=_relay, args=(child.stderr, last_err), daemon=True),
        ]
        for relay in relays:
            relay.start()
        code = _wait(child, should_stop)
        for relay in relays:
            relay.join()
    outcome = None
    if last_out:
        try:
            outcome = json.loads(last_out[0])
        except ValueError:
            outcome = None
    error = last_err[0].removeprefix("error: ") if last_err else None
    return code, outcome, error


def _wait(child: subprocess.Popen[bytes], should_stop: Callable[[], bool] | None) -> int:
    stopping = False
    while True:
        try:
            return child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            if should_stop is not None and not stopping and should_stop():
                child.send_signal(signal.SIGTERM)
                stopping = True


def _relay(stream: IO[bytes] | None, last: list[str]) -> None:
    """Copy a child's stream to our stderr (or where the CLI sends subprocess chatter: its log
    file) chunk by chunk (a progress bar redraws with \r, not a newline), remembering its last
    non-empty line."""
    if stream is None:
        return
    tail = ""
    sink = subprocess_output()
    while chunk := os.read(stream.fileno(), 65536):
        text = chunk.decode("utf-8", errors="replace")
        sink.write(text)
        sink.flush()
        tail = (tail + text)[-65536:]
        lines = [line.strip() for line in tail.replace("\r", "\n").split("\n") if line.strip()]
        if lines:
            last[:] = [lines[-1]]

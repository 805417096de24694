"""MLflow for a training run: what it trained on and how, its per-step metrics, its adapter.

A run logs the resolved config (params, and `config.json`), tags naming the dataset version
and its manifest hash, the base model, the git commit and the config hash, then every metric
the trainer logs (loss, reward mean/std, pass rate, ...) plus tokens/s and the canary pass
rate, and finally the adapter directory as the artifact `adapter` (what the registry versions:
`runs:/<run id>/adapter`).
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from flywheel.settings import Settings

ADAPTER_ARTIFACT = "adapter"
MAX_PARAM_CHARS = 6000


@contextmanager
def mlflow_run(
    *,
    experiment: str,
    run_name: str,
    params: dict[str, Any],
    tags: dict[str, str],
    run_id: str | None = None,
) -> Iterator[str]:
    """A started MLflow run (its id), or the given one continued (a resumed job); ended
    FAILED if the body raises, FINISHED otherwise."""
    settings = Settings()
    mlflow.set_tracking_uri(settings.resolved_mlflow_tracking_uri)
    experiment_id = _experiment_id(experiment, settings)
    with mlflow.start_run(run_id=run_id, experiment_id=experiment_id, run_name=run_name) as run:
        mlflow.log_params({key: _param(value) for key, value in _flat(params).items()})
        mlflow.log_dict(params, "config.json")
        mlflow.set_tags(tags)
        yield run.info.run_id


def log_adapter(adapter_dir: Path) -> str:
    """Log the adapter directory; the URI the registry versions."""
    mlflow.log_artifacts(str(adapter_dir), artifact_path=ADAPTER_ARTIFACT)
    run = mlflow.active_run()
    assert run is not None, "log_adapter is called inside mlflow_run"
    return f"runs:/{run.info.run_id}/{ADAPTER_ARTIFACT}"


def git_commit() -> str:
    """The code's commit: FLYWHEEL_GIT_COMMIT when the launcher set it, else git's."""
    if found := os.environ.get("FLYWHEEL_GIT_COMMIT"):
        return found
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return result.stdout.strip() if result.returncode == 0 else "unknown"


class MlflowMetrics(TrainerCallback):
    """Every numeric value the trainer logs, at its step, plus tokens/s and extra gauges
    (`extra()` returns, e.g., the canary pass rate)."""

    def __init__(self, extra: Callable[[], dict[str, float]] | None = None) -> None:
        self.extra = extra
        self._last: tuple[float, float] | None = None  # (seconds, tokens)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not state.is_world_process_zero or not logs:
            return
        metrics = {
            key.replace("/", "_"): float(value)
            for key, value in logs.items()
            if isinstance(value, int | float) and math.isfinite(value)
        }
        tokens = float(logs.get("num_tokens") or state.num_input_tokens_seen or 0)
        now = time.perf_counter()
        if self._last is not None and tokens > self._last[1] and now > self._last[0]:
            metrics["tokens_per_s"] = (tokens - self._last[1]) / (now - self._last[0])
        self._last = (now, tokens)
        if self.extra is not None:
            metrics |= self.extra()
        if metrics:
            mlflow.log_metrics(metrics, step=state.global_step)


def _experiment_id(name: str, settings: Settings) -> str:
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    location = settings.mlflow_artifact_root.as_uri() if not settings.mlflow_tracking_uri else None
    return str(mlflow.create_experiment(name, artifact_location=location))


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _param(value: Any) -> str:
    text = str(value)
    return text if len(text) <= MAX_PARAM_CHARS else text[: MAX_PARAM_CHARS - 3] + "..."

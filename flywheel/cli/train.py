"""`flywheel train sft|dpo|kto|grpo --domain D`: train a LoRA adapter on a dataset version."""

from __future__ import annotations

from pathlib import Path

import typer

from flywheel.cli.common import (
    JsonOption,
    database_sessions,
    emit,
    resolve_tenant_id,
    settings,
    step,
)
from flywheel.errors import InvalidInput, InvalidState

TRAINER_BAD_INPUT_EXIT = 2  # `python -m finetune` refused its config, export or base model


def train(
    method: str = typer.Argument(..., help="sft, dpo, kto or grpo."),
    overrides: list[str] = typer.Argument(None, help="Config overrides: KEY=VALUE ..."),
    domain: str = typer.Option(..., "--domain", help="The domain to train."),
    dataset_version: int = typer.Option(
        None, "--dataset-version", help="A version number (default: the latest untainted)."
    ),
    base: Path = typer.Option(
        None, "--base", help="Base model directory (default: domain config, FLYWHEEL_BASE_MODEL)."
    ),
    config: Path = typer.Option(None, "--config", help="A YAML training config."),
    gpus: int = typer.Option(1, "--gpus", help="GPUs on this host (>1: accelerate launch)."),
    tenant: str | None = typer.Option(None, "--tenant", help="The domain's tenant."),
    as_json: bool = JsonOption,
) -> None:
    """Export the dataset version, run the recipe as a subprocess, record the training run
    (and its MLflow run, which holds the adapter)."""
    from flywheel.datasets.service import get_version
    from flywheel.db import unit_of_work
    from flywheel.tenancy.service import get_domain
    from flywheel.training.launcher import TrainRequest
    from flywheel.training.launcher import train as launch

    with database_sessions() as sessions:
        with unit_of_work(sessions) as session:
            found = get_domain(session, resolve_tenant_id(session, tenant), domain)
            version_id = (
                None if dataset_version is None else get_version(session, found, dataset_version).id
            )
        request = TrainRequest(
            domain=found,
            method=method,
            dataset_version_id=version_id,
            base=base,
            config=config,
            overrides=tuple(overrides or ()),
            gpus=gpus,
        )
        with step(f"training {method} on {domain}", is_quiet=as_json):
            result = launch(sessions, request, settings())
    data = result.as_json()
    if result.exit_code == TRAINER_BAD_INPUT_EXIT:
        raise InvalidInput(f"{result.error} (run {result.run_id}: nothing trained)")
    if result.status != "succeeded":
        raise InvalidState(f"training {result.status}: {result.error} (run {result.run_id})")
    emit(
        data,
        as_json=as_json,
        text=f"trained {method} on {domain}: MLflow run {result.mlflow_run_id}, "
        f"adapter {result.adapter_uri}, registered as v{result.model_version} (challenger)",
    )

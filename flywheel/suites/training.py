"""Training a suite: one export of every member's train split, one trainer subprocess, one
adapter, registered as a version of each member domain's model.

Each member gets its own training `Run` (its own dataset version: what the evaluation's
lineage check and a forget's tainting follow), all of them the one trainer's run: the same
MLflow run, config and status. The member versions carry the suite in their MLflow tags
(`flywheel.suite`, `flywheel.suite_run_id`) and point at the same adapter.
"""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.membership import prompt_keys
from flywheel.datasets.models import DatasetVersion
from flywheel.datasets.service import build_dataset_version
from flywheel.datasets.versions import latest_version
from flywheel.db import unit_of_work, utcnow
from flywheel.errors import InvalidInput, InvalidState
from flywheel.registry.mlflow_registry import MlflowRegistry
from flywheel.registry.models import Run
from flywheel.registry.service import register_version
from flywheel.scheduling.config import cycle_settings
from flywheel.settings import Settings
from flywheel.suites.export import export_suite
from flywheel.suites.service import LoadedSuite
from flywheel.tenancy.models import Domain
from flywheel.training.launcher import METHODS
from flywheel.training.launcher import _run as run_trainer

DOMAIN_METRICS = "domain_metrics.jsonl"  # finetune.suite_logging writes it (read, not imported)


@dataclass(frozen=True)
class Trained:
    """What the suite's training left: per member, its training run and registered version."""

    mlflow_run_id: str | None
    adapter_uri: str
    run_ids: dict[str, uuid.UUID]
    versions: dict[str, str]
    curves: dict[str, list[list[float | None]]]  # domain -> [step, loss] at each logging step

    def as_json(self) -> dict[str, Any]:
        return {"mlflow_run_id": self.mlflow_run_id, "adapter_uri": self.adapter_uri,
                "training_run_ids": {k: str(v) for k, v in self.run_ids.items()},
                "model_versions": self.versions, "domain_loss": self.curves}  # fmt: skip


def member_versions(session: Session, loaded: LoadedSuite) -> dict[str, DatasetVersion]:
    """Each member's latest untainted dataset version (built when it has none), with train
    items and an eval set to gate on; no member's train may share a prompt with another's
    eval set (the one adapter is scored on every member's)."""
    versions = {m.domain.name: _member_version(session, m.domain) for m in loaded.members}
    for name, version in versions.items():
        others = [v.id for other, v in versions.items() if other != name]
        shared = prompt_keys(session, [version.id], "train") & prompt_keys(session, others, "eval")
        if shared:
            raise InvalidState(
                f"suite {loaded.name!r}: {name}'s train split shares {len(shared)} prompts with "
                "another member's eval set: the suite's adapter could not be scored on it"
            )
    return versions


def _member_version(session: Session, domain: Domain) -> DatasetVersion:
    version = latest_version(session=session, domain_id=domain.id, is_untainted=True)
    if version is None:
        recipe = cycle_settings(domain).dataset_recipe()
        version = build_dataset_version(
            session=session, tenant_id=domain.tenant_id, domain_id=domain.id, recipe=recipe
        ).version
    stats = version.stats or {}
    if not stats.get("train"):
        raise InvalidState(f"member {domain.name}: v{version.version} has no training items")
    if not stats.get("eval"):
        raise InvalidState(f"member {domain.name}: v{version.version} has no eval items to gate on")
    return version


def suite_base(loaded: LoadedSuite, base: Path | None, settings: Settings) -> Path:
    """The one base every member adapts: `base`, else the members' `base_model` (they must
    agree), else FLYWHEEL_BASE_MODEL."""
    configured = {
        str(m.domain.config.get("base_model"))
        for m in loaded.members
        if isinstance(m.domain.config, dict) and m.domain.config.get("base_model")
    }
    if base is None and len(configured) > 1:
        raise InvalidInput(
            f"suite {loaded.name!r}: its members name different base models "
            f"({', '.join(sorted(configured))}): pass --base"
        )
    found = base or (Path(configured.pop()) if configured else settings.base_model)
    if found is None:
        raise InvalidInput("no base model: pass --base, or set the members' base_model")
    if not (found / "config.json").is_file():
        raise InvalidInput(f"{found} is not a model directory (no config.json)")
    return found.resolve()


@dataclass(frozen=True)
class TrainPlan:
    method: str
    base: Path
    config: Path | None
    overrides: tuple[str, ...]

    def check(self) -> None:
        if self.method not in METHODS:
            raise InvalidInput(f"unknown training method {self.method!r}: sft, dpo, kto or grpo")


def start_runs(
    session: Session,
    loaded: LoadedSuite,
    versions: dict[str, DatasetVersion],
    plan: TrainPlan,
    suite_run_id: uuid.UUID,
) -> dict[str, uuid.UUID]:
    """One running training Run per member, the same config (naming the suite) on each."""
    config: dict[str, Any] = {
        "base": str(plan.base),
        "config_file": str(plan.config) if plan.config else None,
        "overrides": list(plan.overrides),
        "suite": loaded.name,
        "suite_run_id": str(suite_run_id),
        "members": {m.domain.name: m.weight for m in loaded.members},
    }
    sha = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    runs = {}
    for member in loaded.members:
        version = versions[member.domain.name]
        run = Run(tenant_id=version.tenant_id, domain_id=version.domain_id,
                  dataset_version_id=version.id, method=plan.method, config=config,
                  config_sha256=sha, status="running", started_at=utcnow())  # fmt: skip
        session.add(run)
        runs[member.domain.name] = run
    session.flush()
    return {name: run.id for name, run in runs.items()}


def export_and_train(
    sessions: sessionmaker[Session],
    loaded: LoadedSuite,
    versions: dict[str, DatasetVersion],
    plan: TrainPlan,
    run_dir: Path,
    run_ids: dict[str, uuid.UUID],
    settings: Settings,
) -> Trained:
    """Export, run the trainer once, record every member's run, register the adapter as a
    version of every member's model (alias `challenger`). `run_dir` is named by the suite
    run's id."""
    with unit_of_work(sessions) as session:
        export_suite(session, loaded, versions, run_dir / "dataset")
    code, outcome, error = run_trainer(_command(plan, run_dir), None)
    found = outcome or {}
    with unit_of_work(sessions) as session:
        for run_id in run_ids.values():
            row = session.get_one(Run, run_id)
            row.status = "succeeded" if code == 0 else "failed"
            row.finished_at, row.mlflow_run_id = utcnow(), found.get("mlflow_run_id")
            row.error = None if code == 0 else error or f"the trainer exited with status {code}"
    adapter_uri = found.get("adapter_uri")
    if code != 0 or not adapter_uri:
        raise InvalidState(f"training the suite failed: {error or f'exit status {code}'}")
    registry = MlflowRegistry(settings.resolved_mlflow_tracking_uri)
    tags = {"flywheel.suite": loaded.name, "flywheel.suite_run_id": run_dir.name}
    versions_out = _register(sessions, registry, run_ids, str(adapter_uri), plan.base, tags)
    curves = domain_curves(run_dir / "job" / DOMAIN_METRICS)
    return Trained(found.get("mlflow_run_id"), str(adapter_uri), run_ids, versions_out, curves)


def domain_curves(path: Path) -> dict[str, list[list[float | None]]]:
    """The trainer's per-domain loss (`finetune.suite_logging`'s file): domain -> [step, loss]
    pairs in step order; empty when the trainer wrote none."""
    curves: dict[str, list[list[float | None]]] = {}
    if not path.is_file():
        return curves
    for line in path.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        curves.setdefault(str(entry["domain"]), []).append([entry["step"], entry["loss"]])
    return curves


def _register(
    sessions: sessionmaker[Session],
    registry: MlflowRegistry,
    run_ids: dict[str, uuid.UUID],
    adapter_uri: str,
    base: Path,
    tags: dict[str, str],
) -> dict[str, str]:
    """The adapter as a version of each member's model (its `challenger`), in one transaction."""
    registered = {}
    with unit_of_work(sessions) as session:
        for name, run_id in run_ids.items():
            version = register_version(session=session, registry=registry,
                                       run=session.get_one(Run, run_id), adapter_uri=adapter_uri,
                                       base_model=str(base), extra_tags=tags)  # fmt: skip
            registered[name] = version.version
    return registered


def _command(plan: TrainPlan, run_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "finetune", plan.method]
    command += ["--dataset", str(run_dir / "dataset"), "--base", str(plan.base)]
    command += ["--out", str(run_dir / "job")]
    if plan.config is not None:
        command += ["--config", str(plan.config.resolve())]
    return [*command, *plan.overrides]

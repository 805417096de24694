"""`flywheel suites train NAME`: train a suite's one adapter, gate it on every member, promote
it in every member or in none.

    train (flywheel.suites.training) -> evaluate each member -> suite gate -> promote each

- evaluate: the member's registered version of the adapter against that member's champion
  (or the base) on that member's own frozen eval set, through the domain's own gate
  (`flywheel.evaluation.service.evaluate_version`, with the member's `cycle.eval` settings).
  An evaluation that fails counts as a refusal.
- suite gate: the suite's candidate passes only when every member's gate passed. Every
  member's verdict is recorded on the suite run; when any member is refused, every member's
  version is marked refused (`registry.service.refuse_versions`), so `flywheel models promote`
  refuses it too.
- promote: each member through the audited promote path (`registry.service.promote`); a
  member that releases by canary keeps it as its challenger.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work, utcnow
from flywheel.errors import FlywheelError
from flywheel.evaluation.service import EvalRequest, evaluate_version
from flywheel.registry.mlflow_registry import MlflowRegistry
from flywheel.registry.models import ModelVersion
from flywheel.registry.release import release_config
from flywheel.registry.service import promote, refuse_versions, registered_model_name
from flywheel.registry.webhooks import deliver_after_move
from flywheel.scheduling.config import cycle_settings
from flywheel.settings import Settings
from flywheel.suites.models import SuiteRun
from flywheel.suites.service import LoadedSuite, get_suite
from flywheel.suites.training import (
    Trained,
    TrainPlan,
    export_and_train,
    member_versions,
    start_runs,
    suite_base,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SuiteRequest:
    tenant_id: uuid.UUID
    suite: str
    method: str = "sft"
    base: Path | None = None
    config: Path | None = None
    overrides: tuple[str, ...] = ()
    is_promoting: bool = True


@dataclass(frozen=True)
class SuiteOutcome:
    run_id: uuid.UUID
    status: str  # succeeded | refused | failed
    result: dict[str, Any]
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"suite_run_id": str(self.run_id), "status": self.status, "error": self.error,
                **self.result}  # fmt: skip


def run_suite(
    sessions: sessionmaker[Session], request: SuiteRequest, settings: Settings
) -> SuiteOutcome:
    """Train, gate per member, promote all or none; see the module's docstring. Bad input
    (unknown suite, base, method) raises before anything is recorded; a later failure ends the
    suite run `failed` with its error."""
    with unit_of_work(sessions) as session:
        loaded = get_suite(session, request.tenant_id, request.suite)
        plan = TrainPlan(request.method, suite_base(loaded, request.base, settings),
                         request.config, request.overrides)  # fmt: skip
        plan.check()
        versions = member_versions(session, loaded)
        row = SuiteRun(tenant_id=loaded.suite.tenant_id, suite_id=loaded.suite.id,
                       method=plan.method, status="running", result={})  # fmt: skip
        session.add(row)
        session.flush()
        run_id = row.id
        run_ids = start_runs(session, loaded, versions, plan, run_id)
        datasets = {name: version.version for name, version in versions.items()}
    result: dict[str, Any] = {"suite": loaded.name, "suite_run_id": str(run_id),
                              "dataset_versions": datasets}  # fmt: skip
    status, error = "failed", None
    try:
        run_dir = (settings.home / "suite_runs" / str(run_id)).resolve()
        trained = export_and_train(sessions, loaded, versions, plan, run_dir, run_ids, settings)
        result |= trained.as_json() | {"run_dir": str(run_dir)}
        result["verdicts"] = _evaluate(sessions, loaded, trained, settings)
        status, result["promoted"] = _gate(sessions, loaded, trained, result, request, settings)
    except FlywheelError as failure:
        error = failure.message
    except Exception as failure:  # recorded on the suite run; the traceback goes to the log
        log.exception("suite run failed", extra={"suite_run_id": str(run_id)})
        error = f"{type(failure).__name__}: {failure}"
    with unit_of_work(sessions) as session:
        row = session.get_one(SuiteRun, run_id)
        row.status, row.result, row.error, row.finished_at = status, result, error, utcnow()
    return SuiteOutcome(run_id, status, result, error)


def _evaluate(
    sessions: sessionmaker[Session], loaded: LoadedSuite, trained: Trained, settings: Settings
) -> dict[str, dict[str, Any]]:
    """Every member's verdict on its own eval set (a failed evaluation is a refusal)."""
    verdicts = {}
    for member in loaded.members:
        name, evaluation = member.domain.name, cycle_settings(member.domain).eval
        request = EvalRequest(domain=member.domain, version=trained.versions[name],
                              k=evaluation.k, max_new_tokens=evaluation.max_new_tokens)  # fmt: skip
        try:
            outcome = evaluate_version(sessions, request, settings).as_json()
        except FlywheelError as failure:
            outcome = {"version": trained.versions[name], "is_promotable": False,
                       "reasons": [f"evaluation failed: {failure.message}"]}  # fmt: skip
        verdicts[name] = outcome
    return verdicts


def refusal(verdicts: dict[str, dict[str, Any]]) -> str | None:
    """Why the suite's candidate is refused (the members whose gates refused it), or None
    when every member's gate passed.

    >>> refusal({"a": {"is_promotable": True}, "b": {"is_promotable": False}})
    'member b was refused by its gate: one adapter is promoted in every member or in none'
    >>> refusal({"a": {"is_promotable": True}}) is None
    True
    """
    refused = sorted(name for name, verdict in verdicts.items() if not verdict["is_promotable"])
    if not refused:
        return None
    which = "members " + ", ".join(refused) if len(refused) > 1 else f"member {refused[0]}"
    by = "were refused by their gates" if len(refused) > 1 else "was refused by its gate"
    return f"{which} {by}: one adapter is promoted in every member or in none"


def _gate(
    sessions: sessionmaker[Session],
    loaded: LoadedSuite,
    trained: Trained,
    result: dict[str, Any],
    request: SuiteRequest,
    settings: Settings,
) -> tuple[str, dict[str, str]]:
    """The suite's verdict: `refused` (every member's version marked so), or `succeeded` with
    the members promoted (member -> what became of its version)."""
    verdicts, run_id = result["verdicts"], result["suite_run_id"]
    reason = refusal(verdicts)
    _tag_suite_verdict(sessions, loaded, trained, reason, settings)
    if reason is not None:
        evidence = {"name": loaded.name, "suite_run_id": run_id, "refused": reason,
                    "verdicts": {n: v["is_promotable"] for n, v in verdicts.items()}}  # fmt: skip
        with unit_of_work(sessions) as session:
            ids = [_version_id(session, m.domain.id, trained.versions[m.domain.name])
                   for m in loaded.members]  # fmt: skip
            refuse_versions(session=session, version_ids=ids, reason=f"suite {loaded.name}: "
                            + reason, evidence=evidence)  # fmt: skip
        result["reasons"] = [reason]
        return "refused", {}
    if not request.is_promoting:
        return "succeeded", dict.fromkeys(trained.versions, "challenger (--no-promote)")
    return "succeeded", _promote_all(sessions, loaded, trained, run_id, settings)


def _promote_all(
    sessions: sessionmaker[Session],
    loaded: LoadedSuite,
    trained: Trained,
    run_id: str,
    settings: Settings,
) -> dict[str, str]:
    """Every member promoted, each in its own transaction (a move is written, then its MLflow
    alias moved: one transaction per registered model keeps each consistent), then the moves'
    webhooks. The verdicts were taken against the current champions just now."""
    registry = MlflowRegistry(settings.resolved_mlflow_tracking_uri)
    moved: dict[str, str] = {}
    for member in loaded.members:
        name = member.domain.name
        if release_config(member.domain).is_canary:
            moved[name] = "challenger (the domain releases by canary)"
            continue
        with unit_of_work(sessions) as session:
            event = promote(session=session, registry=registry, domain=member.domain,
                            version=trained.versions[name], actor=f"suite:{run_id}",
                            reason=f"suite {loaded.name}: every member's gate passed")  # fmt: skip
            event_id = event.id
        deliver_after_move(sessions, event_id)  # never raises: retried later
        moved[name] = "champion"
    return moved


def _tag_suite_verdict(
    sessions: sessionmaker[Session],
    loaded: LoadedSuite,
    trained: Trained,
    reason: str | None,
    settings: Settings,
) -> None:
    """The suite's verdict as a tag of each member's MLflow version (`flywheel.suite_gate`),
    next to the member's own (`flywheel.gate`)."""
    registry = MlflowRegistry(settings.resolved_mlflow_tracking_uri)
    value = "passed in every member" if reason is None else f"refused: {reason}"
    with sessions() as session:
        names = {m.domain.name: registered_model_name(session, m.domain) for m in loaded.members}
    for member in loaded.members:
        name = names[member.domain.name]
        registry.set_version_tag(name, trained.versions[member.domain.name],
                                 "flywheel.suite_gate", value)  # fmt: skip


def _version_id(session: Session, domain_id: uuid.UUID, version: str) -> uuid.UUID:
    return session.scalars(
        select(ModelVersion.id).where(
            ModelVersion.domain_id == domain_id, ModelVersion.version == version
        )
    ).one()

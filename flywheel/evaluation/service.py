"""`flywheel eval`: score a model version and its rival on the domain's frozen eval set, gate.

    evaluate_version(sessions, EvalRequest(domain=get_domain(...)), settings)

The rival is the current champion, or the base model when the domain has none yet (a first
adapter must beat the base the same way). A candidate whose training data shares a prompt with
the eval set is refused before anything is scored (`flywheel.evaluation.lineage`); the verdict
records the rival, the eval set and the training data it holds for, and promotion accepts it
only while that rival is still the champion and that eval set still the current one.

Both are scored by the same subprocess, `python -m finetune.evaluate`, on the eval split of
the domain's latest untainted dataset version (exported as full records, so every score is
keyed by its item id); the adapters are fetched from MLflow. The per-item scores, their
means and the gate's decision with its evidence are stored on the model version (so any
paired comparison can be recomputed), and the verdict is tagged on the version in the MLflow
registry.

Gate policy: `flywheel.evaluation.gate.GatePolicy` defaults, with the primary metric chosen per
domain — the domain config's `primary_metric`, else pass@1 when the eval set has tasks (of
every kind: for tool-call tasks it is their call accuracy, for environment tasks their
environment success), preference accuracy when it has pairs, exact match otherwise; a tool
domain may name `call_accuracy`, `argument_accuracy` or `environment_success` — and every other
metric measured is a secondary one (losses, such as `turns_used`, never are) — with any field
overridden by the
domain config's `gate` mapping (for example `{"min_items": 10}`, or per-slice tolerances
`{"slice_tolerances": {"skill:no-carry": 0.05}}`; a slice no eval item has is refused before
anything is scored). Slices: `flywheel.evaluation.slices` (source kind, tags, difficulty,
the domain's `slice_rules`).

Canaries: `finetune.evaluate` also scores impossible tasks of the eval set's kinds, never in
the paired metrics; each side's canary pass rate goes to the gate. When the eval set has tasks,
canaries are required (`is_canary_required`, unless the domain's `gate` mapping sets it): an
evaluation that ran none is refused. A candidate that passes any canary is refused by the gate,
and the alarm is stored in its gate result (`canary_alarm`) and tagged on its MLflow version
(`flywheel.canary_alarm`).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import uuid
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.models import DatasetVersion
from flywheel.datasets.reader import export_dataset_version, version_item_labels
from flywheel.datasets.versions import latest_version
from flywheel.db import unit_of_work
from flywheel.errors import InvalidInput, InvalidState, NotFound, RegistryUnavailable
from flywheel.evaluation.gate import (
    Evaluation,
    GateDecision,
    GatePolicy,
    decide,
    require_known_slices,
)
from flywheel.evaluation.lineage import check_lineage
from flywheel.evaluation.readiness import LOSS_NAMES, eval_readiness
from flywheel.evaluation.readiness import PRIMARY_ORDER as PRIMARY_ORDER  # reporting reads it here
from flywheel.evaluation.slices import item_slices, slice_rules
from flywheel.registry.mlflow_registry import MlflowRegistry
from flywheel.registry.models import ModelVersion
from flywheel.registry.service import current_champion
from flywheel.settings import Settings
from flywheel.tenancy.models import Domain

SLICE_FIELDS = ("slice", "n", "champion_mean", "challenger_mean", "tolerance", "judged",
                "regressed")  # fmt: skip
"""Per slice, what an outcome shows of the gate's evidence: before (the rival) and after."""


@dataclass(frozen=True)
class EvalRequest:
    domain: Domain  # looked up once by the caller
    version: str | None = None  # None: the newest registered version
    k: int = 4
    max_new_tokens: int = 128
    # the model a first adapter must beat when there is no champion; None: the version's own
    # base (a cycle whose later stages adapt a merged earlier stage passes the domain's base)
    base: Path | None = None


@dataclass(frozen=True)
class EvalOutcome:
    version: str
    against: str  # a version number, or "base"
    dataset_version: int
    summary: dict[str, float]
    against_summary: dict[str, float]
    decision: GateDecision

    def as_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "against": self.against,
            "dataset_version": self.dataset_version,
            "summary": self.summary,
            "against_summary": self.against_summary,
            "is_promotable": self.decision.is_promoted,
            "reasons": self.decision.reasons,
            "slices": [
                {key: row[key] for key in SLICE_FIELDS}
                for row in self.decision.evidence.get("slices", [])
            ],
        }


@dataclass(frozen=True)
class _Plan:
    version_id: uuid.UUID
    version: str
    registered_model: str
    adapter_uri: str
    base_model: Path
    rival: ModelVersion | None
    dataset: DatasetVersion
    train_dataset_id: uuid.UUID  # the candidate's training data (flywheel.evaluation.lineage)
    config: dict[str, Any]
    slices: dict[str, tuple[str, ...]]


def evaluate_version(
    sessions: sessionmaker[Session], request: EvalRequest, settings: Settings
) -> EvalOutcome:
    """Score, gate, store. Nothing is stored if scoring fails."""
    with unit_of_work(sessions) as session:
        plan = _plan(session, request)
        run_dir = (settings.home / "evals" / f"{plan.registered_model}-v{plan.version}").resolve()
        data = run_dir / f"dataset-v{plan.dataset.version}"
        if not data.exists():
            name = request.domain.name
            export_dataset_version(session, plan.dataset, name, data, "jsonl", splits=("eval",))
        rival_adapter = plan.rival.adapter_uri if plan.rival else None
        rival_name = plan.rival.version if plan.rival else "base"
    tracking_uri = settings.resolved_mlflow_tracking_uri
    our_adapter = _fetch(plan.adapter_uri, run_dir / "ours", tracking_uri)
    ours = _score(request, data, plan.base_model, our_adapter, run_dir / "ours.json")
    rival_dir = _fetch(rival_adapter, run_dir / "rival", tracking_uri) if rival_adapter else None
    rival_base = Path(plan.rival.base_model) if plan.rival else request.base or plan.base_model
    theirs = _score(request, data, rival_base, rival_dir, run_dir / f"{rival_name}.json")
    policy = _with_canary_rule(_policy(plan.config, ours["metrics"]), plan.config, ours)
    decision = decide(
        Evaluation(ours["metrics"], plan.slices, _canary_pass_rate(ours)),
        Evaluation(theirs["metrics"], plan.slices, _canary_pass_rate(theirs)),
        policy,
    )
    alarm = _canary_alarm(ours)
    with unit_of_work(sessions) as session:
        row = session.get_one(ModelVersion, plan.version_id)
        row.eval_results = {
            "dataset_version_id": str(plan.dataset.id),
            "dataset_version": plan.dataset.version,
            "eval_sha256": plan.dataset.eval_sha256,
            "summary": ours["summary"],
            "losses": ours.get("losses", {}),
            "scores": ours["metrics"],
            "slices": plan.slices,
            "canaries": ours.get("canaries"),
            "against": {"version": rival_name, "summary": theirs["summary"],
                        "scores": theirs["metrics"], "canaries": theirs.get("canaries")},
        }  # fmt: skip
        row.gate_result = {
            "is_promoted": decision.is_promoted,
            "reasons": decision.reasons,
            "against": rival_name,
            # what the verdict holds for: promotion needs this rival and this eval set current
            "against_model_version_id": str(plan.rival.id) if plan.rival else None,
            "eval_dataset_version_id": str(plan.dataset.id),
            "eval_sha256": plan.dataset.eval_sha256,
            "train_dataset_version_id": str(plan.train_dataset_id),
            "evidence": decision.evidence,
            "canary_alarm": alarm,
        }
    _tag_verdict(tracking_uri, plan, decision, rival_name, alarm)
    return EvalOutcome(
        plan.version, rival_name, plan.dataset.version, ours["summary"], theirs["summary"], decision
    )


def _plan(session: Session, request: EvalRequest) -> _Plan:
    domain = request.domain
    query = select(ModelVersion).where(ModelVersion.domain_id == domain.id)
    if request.version is not None:
        query = query.where(ModelVersion.version == request.version)
    target = session.scalars(query.order_by(ModelVersion.created_at.desc()).limit(1)).first()
    if target is None:
        which = f"version {request.version!r}" if request.version else "registered versions"
        raise NotFound(f"{domain.name} has no {which}: flywheel train ... first")
    dataset = latest_version(session=session, domain_id=domain.id, is_untainted=True)
    if dataset is None:
        raise InvalidState(f"{domain.name} has no untainted dataset version to evaluate on")
    config: dict[str, Any] = dict(domain.config or {})
    _require_scorable(dataset, domain.name, config)
    train_dataset_id = check_lineage(session, target, dataset, domain.name)
    champion = current_champion(session, domain.id)
    rival = champion if champion is not None and champion.id != target.id else None
    return _Plan(
        target.id,
        target.version,
        target.registered_model,
        target.adapter_uri,
        Path(target.base_model),
        rival,
        dataset,
        train_dataset_id,
        config,
        _eval_slices(session, dataset, config),
    )


def _require_scorable(dataset: DatasetVersion, domain: str, config: dict[str, Any]) -> None:
    """InvalidState, before anything is fetched or scored, when the eval split holds nothing
    the gate can score."""
    counts = (dataset.stats or {}).get("eval") or {}
    readiness = eval_readiness(counts, config)
    if readiness.scored:
        return
    held = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "nothing"
    metric = f" on {readiness.metric}" if readiness.metric else ""
    raise InvalidState(
        f"dataset v{dataset.version} of {domain} has no eval item to score{metric} (its eval "
        f"split holds {held}): build a version with an eval split (`dataset: "
        f"{{min_eval_items: {readiness.min_items}}}` in the domain's config makes new groups "
        "fill eval first; groups already placed keep their split), then evaluate"
    )


def _eval_slices(
    session: Session, dataset: DatasetVersion, config: dict[str, Any]
) -> dict[str, tuple[str, ...]]:
    """Eval item id -> its slices; a gate config naming a slice none has is refused here,
    before anything is scored."""
    slices = item_slices(version_item_labels(session, dataset, "eval"), slice_rules(config))
    tolerances = (config.get("gate") or {}).get("slice_tolerances") or {}
    require_known_slices(tolerances, {label for labels in slices.values() for label in labels})
    return slices


def _fetch(adapter_uri: str, target: Path, tracking_uri: str) -> Path:
    """The adapter's files from MLflow, once."""
    if (target / "adapter_config.json").is_file():
        return target
    import mlflow.artifacts

    try:
        found = mlflow.artifacts.download_artifacts(
            artifact_uri=adapter_uri, dst_path=str(target), tracking_uri=tracking_uri
        )
    except Exception as error:  # every MLflow or network failure means the same here
        raise RegistryUnavailable(f"cannot fetch {adapter_uri} from MLflow: {error}") from error
    return Path(found)


def _score(
    request: EvalRequest, data: Path, base: Path, adapter: Path | None, out: Path
) -> dict[str, Any]:
    command = [sys.executable, "-m", "finetune.evaluate", "--dataset", str(data),
               "--base", str(base), "--out", str(out), "--split", "eval", "--k", str(request.k),
               "--max-new-tokens", str(request.max_new_tokens)]  # fmt: skip
    if adapter is not None:
        command += ["--adapter", str(adapter)]
    result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise InvalidState(f"evaluation failed: {last.removeprefix('error: ')}")
    scores: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return scores


def _policy(config: dict[str, Any], metrics: dict[str, Any]) -> GatePolicy:
    if not metrics:
        raise InvalidState("the eval set has no items to score")
    primary = config.get("primary_metric") or next(
        (name for name in PRIMARY_ORDER if name in metrics), sorted(metrics)[0]
    )
    if primary in LOSS_NAMES:
        raise InvalidInput(
            f"the domain's primary metric {primary!r} is a loss, reported but never gated: "
            "name a metric in [0, 1] (pass@1, call_accuracy, environment_success, ...)"
        )
    if primary not in metrics:
        raise InvalidInput(f"the domain's primary metric {primary!r} was not measured")
    overrides = dict(config.get("gate") or {})
    known = {field.name for field in fields(GatePolicy)}
    unknown = set(overrides) - known
    if unknown:
        raise InvalidInput(f"unknown gate settings in the domain config: {sorted(unknown)}")
    secondary = tuple(sorted(name for name in metrics if name != primary))
    return GatePolicy(**{"primary_metric": primary, "secondary_metrics": secondary, **overrides})


def _canary_pass_rate(scores: dict[str, Any]) -> float | None:
    """The evaluation's canary pass rate; None when it ran none."""
    rate = (scores.get("canaries") or {}).get("pass_rate")
    return None if rate is None else float(rate)


def _with_canary_rule(
    policy: GatePolicy, config: dict[str, Any], scores: dict[str, Any]
) -> GatePolicy:
    """Canaries are required when the eval set has tasks, unless the domain's gate says."""
    has_tasks = bool(scores.get("counts", {}).get("tasks"))
    if not has_tasks or "is_canary_required" in (config.get("gate") or {}):
        return policy
    return dataclasses.replace(policy, is_canary_required=True)


def _canary_alarm(scores: dict[str, Any]) -> str | None:
    """A one-line alarm when the model passed any canary, else None."""
    canaries = scores.get("canaries") or {}
    if not canaries.get("passed"):
        return None
    ids = canaries.get("passed_ids", [])
    return (
        f"passed {canaries['passed']} of {canaries['count']} canaries at evaluation "
        f"({', '.join(ids[:5])}): reward hacking or a broken verifier"
    )


def _tag_verdict(
    tracking_uri: str, plan: _Plan, decision: GateDecision, against: str, alarm: str | None
) -> None:
    """The verdict, and a canary alarm when there is one, as tags of the MLflow version."""
    registry = MlflowRegistry(tracking_uri)
    verdict = "passed" if decision.is_promoted else "failed"
    registry.set_version_tag(
        plan.registered_model, plan.version, "flywheel.gate", f"{verdict} against {against}"
    )
    if alarm is not None:
        registry.set_version_tag(
            plan.registered_model, plan.version, "flywheel.canary_alarm", alarm
        )

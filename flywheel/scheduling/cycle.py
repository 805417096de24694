"""`flywheel cycle --domain D`: one full turn of the flywheel for a domain.

    compile -> build -> train_<method>... -> evaluate -> promote

- compile: the domain's new feedback compiled into training signal, its near-duplicates
  linked (`flywheel.signals.compile.compile_feedback` with `link`, as `flywheel compile` does).
- build: the next dataset version. If a cycle already finished on that version, there is
  nothing to do: the run ends `skipped`.
- train_<method>: each method of the domain's `cycle.methods` in a subprocess
  (`flywheel.training.launcher`); a later method trains a fresh adapter on the earlier stage
  merged into its base (`python -m finetune.merge`). The last adapter is the candidate.
- evaluate: the candidate against the champion (or the base) on the frozen eval split; gate.
- promote: when the gate passed (and `auto_promote`), the candidate becomes the champion;
  unless the domain releases by canary (`release.challenger_share` > 0 or `release.shadow`):
  then it stays the challenger, served next to the champion, and the live watch
  (`flywheel.registry.canary`) promotes or retires it on real users' feedback.

Every step's status, start, end, duration and result are kept on the cycle's Run, as
each finishes. A cycle that crashed, was killed or failed resumes at its first unfinished step
(`flywheel cycle` again, or the worker's retried job); the steps before it are not redone.
A running cycle beats a heartbeat and checks for cancellation between and during steps.
The domain is looked up once, when the run is claimed; every step works with that row (and
the configuration it had then), passing ids down.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.service import build_dataset_version
from flywheel.db import unit_of_work, utcnow
from flywheel.errors import FlywheelError, InvalidState
from flywheel.evaluation.service import EvalRequest, evaluate_version
from flywheel.observability import cycle_metrics
from flywheel.registry.mlflow_registry import MlflowRegistry
from flywheel.registry.models import Run
from flywheel.registry.release import ReleaseConfig, release_config
from flywheel.registry.service import promote
from flywheel.registry.webhooks import deliver_after_move
from flywheel.scheduling.config import CycleSettings, Method, cycle_settings
from flywheel.scheduling.runs import claim_run
from flywheel.settings import Settings
from flywheel.signals.compile import compile_feedback
from flywheel.tenancy.models import Domain
from flywheel.tenancy.service import get_domain
from flywheel.training.launcher import TrainRequest, train

log = logging.getLogger(__name__)


class Cancelled(Exception):
    """The run was asked to stop."""


@dataclass(frozen=True)
class CycleRequest:
    tenant_id: uuid.UUID
    domain: str
    trigger: str = "manual"  # manual | api | schedule
    run_id: uuid.UUID | None = None  # carry out this queued (or interrupted) run


@dataclass(frozen=True)
class CycleOutcome:
    run_id: uuid.UUID
    status: str  # succeeded | failed | cancelled | skipped
    steps: dict[str, Any]
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"run_id": str(self.run_id), "status": self.status, "error": self.error,
                "steps": self.steps}  # fmt: skip


Progress = Callable[[str, dict[str, Any]], None]


def run_cycle(
    sessions: sessionmaker[Session],
    request: CycleRequest,
    settings: Settings,
    *,
    progress: Progress | None = None,
) -> CycleOutcome:
    """Run (or resume) the domain's cycle to its end; see the module's docstring."""
    with unit_of_work(sessions) as session:
        if request.run_id is not None:
            finished = _finished(session, request)
            if finished is not None:
                return finished  # a retried job whose run had already ended
        domain = get_domain(session, request.tenant_id, request.domain)
        config = cycle_settings(domain)  # a bad config fails before the run is claimed
        release_config(domain)  # and so does a bad release section
        configured = domain.config.get("base_model") if isinstance(domain.config, dict) else None
        run = claim_run(
            session,
            domain=domain,
            trigger=request.trigger,
            run_id=request.run_id,
            stale_after_s=settings.cycle_stale_after_s,
        )
    cycle_metrics().cycles.labels(event="started").inc()
    cycle = _Cycle(sessions, settings, request, domain, run.id, config, configured, progress)
    with cycle.heartbeat():
        status, error = cycle.run()
    with unit_of_work(sessions) as session:
        row = session.get_one(Run, run.id)
        row.status, row.error, row.finished_at = status, error, utcnow()
        steps = in_order(row.steps)
    cycle_metrics().cycles.labels(event=status).inc()
    log.info("cycle %s", status, extra={"run_id": str(run.id), "domain": request.domain})
    return CycleOutcome(run.id, status, steps, error)


def _finished(session: Session, request: CycleRequest) -> CycleOutcome | None:
    run = session.get(Run, request.run_id)
    if (
        run is not None
        and run.tenant_id == request.tenant_id
        and run.status in ("succeeded", "skipped", "cancelled")
    ):
        return CycleOutcome(run.id, run.status, dict(run.steps), run.error)
    return None


def _named(version: object) -> str:
    """ "base", or a version number as "v3"."""
    return f"v{version}" if str(version).isdigit() else str(version)


def _canary(release: ReleaseConfig) -> str:
    """What became of a gate-passing candidate in a domain that releases by canary."""
    parts = []
    if release.challenger_share > 0:
        parts.append(f"released to {release.challenger_share * 100:g}% of users by canary")
    if release.shadow:
        parts.append("answering in shadow (recorded, never shown)")
    return " and ".join(parts) + ": the live watch promotes or retires it"


def in_order(steps: dict[str, Any]) -> dict[str, Any]:
    """Steps in the order they started (PostgreSQL's JSONB does not keep key order)."""
    return dict(sorted(steps.items(), key=lambda item: str(item[1].get("started_at", ""))))


class _Skip(Exception):
    """Nothing to do: the cycle ends `skipped` with this reason."""


class _Cycle:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        settings: Settings,
        request: CycleRequest,
        domain: Domain,
        run_id: uuid.UUID,
        config: CycleSettings,
        configured_base: object,
        progress: Progress | None,
    ) -> None:
        self.sessions, self.settings, self.request = sessions, settings, request
        self.domain = domain  # looked up once, when the run was claimed
        self.run_id, self.config, self.progress = run_id, config, progress
        self.configured_base = Path(str(configured_base)) if configured_base else None
        self.stop = threading.Event()

    def run(self) -> tuple[str, str | None]:
        steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("compile", self.compile),
            ("build", self.build),
        ]
        steps += [(f"train_{method}", self.trainer(method)) for method in self.config.methods]
        steps += [("evaluate", self.evaluate), ("promote", self.promote)]
        try:
            for name, step in steps:
                self.step(name, step)
        except _Skip as skip:
            return "skipped", str(skip)
        except Cancelled:
            return "cancelled", "cancelled on request"
        except FlywheelError as error:
            return "failed", error.message
        except Exception as error:  # a cycle records any failure; the traceback goes to the log
            log.exception("cycle step failed", extra={"run_id": str(self.run_id)})
            return "failed", f"{type(error).__name__}: {error}"
        return "succeeded", None

    # -- bookkeeping ---------------------------------------------------------------------

    def step(self, name: str, work: Callable[[], dict[str, Any]]) -> None:
        """Run a step unless an earlier attempt finished it; record it either way."""
        if self.done(name) is not None:
            self.report(name, {"status": "succeeded", "resumed": True})
            return
        if self.stop.is_set():
            raise Cancelled
        started = utcnow()
        self.record(name, {"status": "running", "started_at": started.isoformat()})
        self.report(name, {"status": "running"})
        clock = time.monotonic()
        try:
            result = work()
        except _Skip as skip:
            self.record(name, self.ended(started, clock, "skipped", {"reason": str(skip)}))
            raise
        except BaseException as error:
            status = "cancelled" if isinstance(error, Cancelled) else "failed"
            message = getattr(error, "message", None) or f"{type(error).__name__}: {error}"
            self.record(name, self.ended(started, clock, status, {"error": message}))
            raise
        entry = self.ended(started, clock, "succeeded", result)
        self.record(name, entry)
        cycle_metrics().step_seconds.labels(step=name.split("_")[0]).observe(entry["duration_s"])
        self.report(name, entry)

    @staticmethod
    def ended(started: Any, clock: float, status: str, result: dict[str, Any]) -> dict[str, Any]:
        return {"status": status, "started_at": started.isoformat(),
                "finished_at": utcnow().isoformat(),
                "duration_s": round(time.monotonic() - clock, 3), "result": result}  # fmt: skip

    def done(self, name: str) -> dict[str, Any] | None:
        """A step's result if an earlier attempt of this run finished it."""
        with self.sessions() as session:
            entry = session.get_one(Run, self.run_id).steps.get(name)
        if isinstance(entry, dict) and entry.get("status") == "succeeded":
            result: dict[str, Any] = entry.get("result") or {}
            return result
        return None

    def record(self, name: str, entry: dict[str, Any]) -> None:
        with unit_of_work(self.sessions) as session:
            run = session.get_one(Run, self.run_id)
            run.steps = {**run.steps, name: entry}  # a new dict: JSON columns track assignment
            if name == "build" and entry.get("status") == "succeeded":
                run.dataset_version_id = uuid.UUID(entry["result"]["dataset_version_id"])
        log.info(
            "cycle step %s %s", name, entry["status"],
            extra={"run_id": str(self.run_id), "step": name, "status": entry["status"],
                   "duration_s": entry.get("duration_s")},
        )  # fmt: skip

    def report(self, name: str, entry: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress(name, entry)

    @contextmanager
    def heartbeat(self) -> Iterator[None]:
        """Mark the run alive every `cycle_heartbeat_s`, and notice a cancellation request."""
        finished = threading.Event()

        def beat() -> None:
            while not finished.wait(self.settings.cycle_heartbeat_s):
                with unit_of_work(self.sessions) as session:
                    run = session.get_one(Run, self.run_id)
                    run.heartbeat_at = utcnow()
                    if run.cancel_requested_at is not None:
                        self.stop.set()

        thread = threading.Thread(target=beat, name=f"heartbeat-{self.run_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            finished.set()
            thread.join()

    # -- the steps -----------------------------------------------------------------------

    def compile(self) -> dict[str, Any]:
        report = compile_feedback(
            self.sessions, tenant_id=self.domain.tenant_id, domain_id=self.domain.id, link=True
        )
        return {"feedback": report.domains[0].as_json()}

    def build(self) -> dict[str, Any]:
        with unit_of_work(self.sessions) as session:
            built = build_dataset_version(
                session=session,
                tenant_id=self.domain.tenant_id,
                domain_id=self.domain.id,
                recipe=self.config.dataset_recipe(),
            )
            version = built.version
            result = {"dataset_version_id": str(version.id), "dataset_version": version.version,
                      "is_new": built.is_new, "train": version.stats.get("train", {}),
                      "eval": version.stats.get("eval", {})}  # fmt: skip
            before = session.scalars(
                select(Run).where(
                    Run.method == "cycle",
                    Run.status == "succeeded",
                    Run.dataset_version_id == version.id,
                    Run.id != self.run_id,
                )
            ).first()
        if before is not None:
            raise _Skip(f"v{version.version} was already cycled (run {before.id})")
        if not result["train"]:
            raise _Skip(f"v{version.version} has no training items")
        if not result["eval"]:
            raise InvalidState(
                f"v{version.version} has no eval items to gate on: raise the domain's "
                "cycle.recipe.eval_fraction or add signal"
            )
        return result

    def trainer(self, method: Method) -> Callable[[], dict[str, Any]]:
        def train_step() -> dict[str, Any]:
            built = self.done("build") or {}
            base = self.stage_base(method)
            outcome = train(
                self.sessions,
                TrainRequest(
                    domain=self.domain,
                    method=method,
                    dataset_version_id=uuid.UUID(built["dataset_version_id"]),
                    base=base,
                    config=self.config.configs.get(method),
                    overrides=tuple(self.config.overrides.get(method, ())),
                ),
                self.settings,
                should_stop=self.stop.is_set,
            )
            if outcome.status == "cancelled":
                raise Cancelled
            if outcome.status != "succeeded":
                raise InvalidState(f"training {method} {outcome.status}: {outcome.error}")
            return outcome.as_json() | {"base": str(base) if base else None}

        return train_step

    def stage_base(self, method: Method) -> Path | None:
        """The first method adapts the domain's base; a later one the previous stage merged."""
        index = self.config.methods.index(method)
        if index == 0:
            return self.configured_base
        previous = self.done(f"train_{self.config.methods[index - 1]}") or {}
        merged = Path(previous["run_dir"]) / "merged"
        if not (merged / "config.json").is_file():
            adapter = Path(previous["run_dir"]) / "job" / "adapter"
            base = previous.get("base") or str(self.origin_base())
            command = [sys.executable, "-m", "finetune.merge", "--base", base,
                       "--adapter", str(adapter), "--out", str(merged)]  # fmt: skip
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise InvalidState(f"merging the {previous.get('model_version')} adapter: {last}")
        return merged

    def origin_base(self) -> Path:
        first = self.done(f"train_{self.config.methods[0]}") or {}
        base = first.get("base") or self.configured_base or self.settings.base_model
        if base is None:
            raise InvalidState("no base model: set the domain's base_model or FLYWHEEL_BASE_MODEL")
        return Path(str(base))

    def candidate(self) -> str:
        last = self.done(f"train_{self.config.methods[-1]}") or {}
        version = last.get("model_version")
        if not version:
            raise InvalidState("the last training step registered no model version")
        return str(version)

    def evaluate(self) -> dict[str, Any]:
        outcome = evaluate_version(
            self.sessions,
            EvalRequest(
                domain=self.domain,
                version=self.candidate(),
                k=self.config.eval.k,
                max_new_tokens=self.config.eval.max_new_tokens,
                base=self.origin_base() if len(self.config.methods) > 1 else None,
            ),
            self.settings,
        )
        cycle_metrics().gate_decisions.labels(
            outcome="passed" if outcome.decision.is_promoted else "failed"
        ).inc()
        return outcome.as_json()

    def promote(self) -> dict[str, Any]:
        gate = self.done("evaluate") or {}
        version = self.candidate()
        if not gate.get("is_promotable"):
            return {"promoted": False, "version": version, "reasons": gate.get("reasons", [])}
        release = release_config(self.domain)
        if release.is_canary:
            return {"promoted": False, "version": version, "challenger": True,
                    "reasons": [_canary(release)]}  # fmt: skip
        if not self.config.auto_promote:
            return {"promoted": False, "version": version, "reasons": ["auto_promote is off"]}
        with unit_of_work(self.sessions) as session:
            event = promote(
                session=session,
                registry=MlflowRegistry(self.settings.resolved_mlflow_tracking_uri),
                domain=self.domain,
                version=version,
                actor=f"cycle:{self.run_id}",
                reason=f"gate passed against {_named(gate.get('against'))}",
            )
            event_id = event.id
        sent = deliver_after_move(self.sessions, event_id)  # never raises: retried later
        return {"promoted": True, "version": version, "promotion_event_id": str(event_id),
                "webhooks": sent.as_json()}  # fmt: skip

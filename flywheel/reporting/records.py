"""What a domain report holds: plain data, gathered once, rendered without the database."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from flywheel.reporting.metrics import RunMetrics


@dataclass(frozen=True)
class DatasetRow:
    version: int
    created_at: datetime
    train: dict[str, int]
    """Item kind (sft, pair, task, ...) -> count in the train split."""
    eval: dict[str, int]
    is_tainted: bool


@dataclass(frozen=True)
class StepRow:
    """One step of a cycle (compile, build, train_sft, evaluate, promote, ...)."""

    name: str
    status: str
    started_at: str | None
    finished_at: str | None
    duration_s: float | None


@dataclass(frozen=True)
class RunRow:
    id: str
    method: str
    status: str
    dataset_version: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    mlflow_run_id: str | None
    model_version: str | None
    """The version registered from this run, if any."""
    steps: list[StepRow] = field(default_factory=list)
    metrics: RunMetrics | None = None
    metrics_error: str | None = None
    """Why the run's MLflow metrics could not be read."""

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()

    @property
    def label(self) -> str:
        """How charts name the run: its method and the version it produced."""
        made = f"v{self.model_version}" if self.model_version else f"run {self.id[:8]}"
        return f"{self.method} {made}"


@dataclass(frozen=True)
class SliceRow:
    """One slice of a gate decision: the primary metric before (the rival) and after."""

    label: str
    n: int
    champion_mean: float | None
    challenger_mean: float | None
    tolerance: float | None
    is_judged: bool
    is_regressed: bool


@dataclass(frozen=True)
class EvalRow:
    """A model version's held-out evaluation and gate decision."""

    version: str
    created_at: datetime
    against: str | None
    """"base", or the champion version it was compared with; None when never evaluated."""
    dataset_version: int | None
    summary: dict[str, float]
    against_summary: dict[str, float]
    loss_names: list[str]
    """Summary entries that are losses (lower is better), not scores in [0, 1]."""
    primary_metric: str | None
    is_promoted: bool | None
    """The gate's decision; None when it has not been gated."""
    reasons: list[str]
    is_tainted: bool
    slices: list[SliceRow] = field(default_factory=list)
    """The gate's per-slice evidence, in the gate's order."""

    @property
    def is_evaluated(self) -> bool:
        return bool(self.summary)


@dataclass(frozen=True)
class EventRow:
    at: datetime
    alias: str
    action: str
    from_version: str | None
    to_version: str | None
    actor: str
    is_forced: bool
    reason: str


@dataclass(frozen=True)
class DomainReport:
    tenant: str
    domain: str
    registered_model: str
    generated_at: datetime
    champion: str | None
    champion_since: datetime | None
    datasets: list[DatasetRow]
    runs: list[RunRow]
    evaluations: list[EvalRow]
    events: list[EventRow]

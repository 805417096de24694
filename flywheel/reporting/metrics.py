"""A training run's metric histories, read from MLflow.

What the trainer logs (finetune/tracking.py `MlflowMetrics`): every numeric value the
transformers/TRL trainer logs, at its global step, with "/" turned into "_" — `loss`,
`grad_norm`, `learning_rate`, `epoch`, `num_tokens`, SFT's `mean_token_accuracy`, DPO's
`rewards_margins`/`rewards_accuracies`, GRPO's `reward`, `reward_std`, `kl` and
`rewards_<function>_mean` — plus `tokens_per_s`, and for GRPO `canary_pass_rate` and
`canary_alarms`. The report charts `loss` and `reward` and quotes the latest values of a few.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from flywheel.errors import RegistryUnavailable

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

HISTORY_KEYS = ("loss", "reward")
"""Metrics whose whole history is read (one chart each)."""

LATEST_KEYS = ("loss", "train_loss", "reward", "tokens_per_s", "canary_pass_rate")
"""Metrics whose latest value the runs table quotes, when the run logged them."""

RUN_ERRORS = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")
"""MLflow error codes that are about the run asked for, not about the store."""


@dataclass(frozen=True)
class RunMetrics:
    histories: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Metric key -> (step, value), in step order."""
    latest: dict[str, float] = field(default_factory=dict)
    """Metric key -> its last logged value."""


class MetricReader(Protocol):
    def read(self, run_id: str) -> RunMetrics:
        """The run's metrics; raises when they cannot be read (unknown run, store down)."""
        ...


class MlflowMetricReader:
    """Metrics from an MLflow tracking store or server, one client for every run.

    A failure about one run (unknown id) fails that run's read only. Any other failure (the
    server unreachable, the store broken) fails every later read at once with the same error:
    an unreachable server costs MLflow's whole retry schedule (minutes) per call, so it is
    paid once per report, not once per run.
    """

    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self._client: MlflowClient | None = None
        self._outage: str | None = None

    def read(self, run_id: str) -> RunMetrics:
        from mlflow.exceptions import MlflowException

        if self._outage is not None:
            raise RegistryUnavailable(self._outage)
        try:
            return self._read(run_id)
        except Exception as error:  # whatever MLflow, its store or the network raised
            if isinstance(error, MlflowException) and error.error_code in RUN_ERRORS:
                raise
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            self._outage = f"MLflow at {self.tracking_uri} is unavailable: {first_line}"
            raise RegistryUnavailable(self._outage) from error

    def _read(self, run_id: str) -> RunMetrics:
        from mlflow.tracking import MlflowClient  # import on use: a report with no runs skips it

        if self._client is None:
            self._client = MlflowClient(self.tracking_uri)
        client = self._client
        logged = client.get_run(run_id).data.metrics
        histories = {
            key: sorted(
                (float(entry.step), float(entry.value))
                for entry in client.get_metric_history(run_id, key)
            )
            for key in HISTORY_KEYS
            if key in logged
        }
        latest = {key: float(logged[key]) for key in LATEST_KEYS if key in logged}
        return RunMetrics(histories, latest)

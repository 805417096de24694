"""Structured logs and the workers' Prometheus metrics.

Logs: `configure_logging(json_lines=True)` writes one JSON object per record (time, level,
logger, message and every `extra={...}` field), for a log shipper; plain text otherwise.
Metrics: the cycle's counters and timings live in a registry of their own, created on first
use (`cycle_metrics()`); `flywheel worker --metrics-port N` serves it. The API's request and
ingest metrics are in `api.middleware.ApiMetrics`, served at `GET /metrics`.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded on use: the CLI imports this module at start-up
    from prometheus_client import CollectorRegistry, Counter, Histogram

# LogRecord's own attributes: everything else on a record came from `extra=`.
_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry |= {k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        import orjson

        return orjson.dumps(entry, default=str).decode()


def configure_logging(*, json_lines: bool, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def json_log_config(level: str = "INFO") -> dict[str, Any]:
    """`logging.config.dictConfig` for JSON lines: what `flywheel serve --json` hands uvicorn,
    which applies it in every server process (its access log included)."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    quiet = {"handlers": ["default"], "level": level, "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {"default": handler},
        "loggers": {"uvicorn": quiet, "uvicorn.error": quiet, "uvicorn.access": quiet},
        "root": {"handlers": ["default"], "level": level},
    }


# Where a subprocess's chatter (a trainer's progress bars and warnings) is copied to: stderr,
# unless the CLI sends it to the workspace's log file (`send_subprocess_output`).
_subprocess_outputs: list[Callable[[], IO[str]]] = []


def subprocess_output() -> IO[str]:
    """The stream a subprocess's chatter is copied to now."""
    return _subprocess_outputs[-1]() if _subprocess_outputs else sys.stderr


def send_subprocess_output(opener: Callable[[], IO[str]]) -> Callable[[], None]:
    """Copy subprocesses' chatter to the stream `opener` returns (opened when first written)
    until the returned function is called."""
    _subprocess_outputs.append(opener)
    return lambda: _subprocess_outputs.remove(opener)


class CycleMetrics:
    registry: CollectorRegistry
    cycles: Counter
    step_seconds: Histogram
    gate_decisions: Counter

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.cycles = Counter(
            "flywheel_cycles",
            "Cycles by event: started, then succeeded, failed, cancelled or skipped.",
            ["event"],
            registry=self.registry,
        )
        self.step_seconds = Histogram(
            "flywheel_cycle_step_duration_seconds",
            "How long each cycle step took.",
            ["step"],
            registry=self.registry,
            buckets=(1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600),
        )
        self.gate_decisions = Counter(
            "flywheel_gate_decisions",
            "Gate outcomes of evaluated candidates.",
            ["outcome"],
            registry=self.registry,
        )


@functools.cache
def cycle_metrics() -> CycleMetrics:
    """The process's cycle metrics (one registry per process, made on first use)."""
    return CycleMetrics()

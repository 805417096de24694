"""Structured logs: one JSON object per record, with the record's own fields; the same format
for uvicorn's loggers through the dictConfig `flywheel serve --json` hands it."""

from __future__ import annotations

import json
import logging
import logging.config
import sys
from collections.abc import Iterator

import pytest

from flywheel.observability import JsonFormatter, cycle_metrics, json_log_config


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True


def test_a_record_becomes_one_json_line_with_its_extra_fields() -> None:
    record = logging.LogRecord("flywheel.x", logging.INFO, "f.py", 1, "step %s", ("train",), None)
    record.run_id = "r-1"
    record.duration_s = 1.5

    entry = json.loads(JsonFormatter().format(record))

    assert entry["message"] == "step train"
    assert (entry["level"], entry["logger"]) == ("info", "flywheel.x")
    assert (entry["run_id"], entry["duration_s"]) == ("r-1", 1.5)
    assert "args" not in entry  # the record's own attributes stay out
    assert entry["time"].endswith("+00:00")


def test_an_exception_is_kept_in_the_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, "f.py", 1, "failed", None, True)
        record.exc_info = sys.exc_info()

    entry = json.loads(JsonFormatter().format(record))

    assert "ValueError: boom" in entry["exception"]


def test_the_server_log_config_writes_uvicorn_records_as_json(
    restored_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logging.config.dictConfig(json_log_config())

    logging.getLogger("uvicorn.access").info("GET /healthz 200")

    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert json.loads(line)["logger"] == "uvicorn.access"


def test_cycle_metrics_are_one_registry_per_process() -> None:
    metrics = cycle_metrics()
    metrics.cycles.labels(event="started").inc()

    assert cycle_metrics() is metrics
    value = metrics.registry.get_sample_value("flywheel_cycles_total", {"event": "started"})
    assert value is not None
    assert value >= 1

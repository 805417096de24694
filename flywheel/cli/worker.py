"""`flywheel worker`: carry out queued cycles and the schedule's housekeeping (PostgreSQL)."""

from __future__ import annotations

import typer

from flywheel.cli.common import JsonOption, database_sessions, emit, settings
from flywheel.errors import InvalidInput


def worker(
    queue: list[str] | None = typer.Option(
        None,
        "--queue",
        help="A queue to work: gpu (cycles, training) or cpu (schedule, stalled-job retry). "
        "Repeat for both; default both.",
    ),
    concurrency: int = typer.Option(
        1, min=1, help="Jobs at once (each cycle trains in its own subprocess)."
    ),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", min=1, max=65535, help="Serve Prometheus metrics on this port."
    ),
    name: str | None = typer.Option(None, help="Worker name in logs (default: the host name)."),
    as_json: bool = JsonOption,
) -> None:
    """Run a job worker until SIGINT/SIGTERM: the first signal lets running jobs finish,
    a second one exits at once (the job is retried elsewhere and resumes)."""
    from flywheel.observability import configure_logging, cycle_metrics
    from flywheel.scheduling import jobs

    queues = list(dict.fromkeys(queue or jobs.QUEUES))
    unknown = [q for q in queues if q not in jobs.QUEUES]
    if unknown:
        raise InvalidInput(f"unknown queue {unknown[0]!r}: use gpu or cpu")
    current = settings()
    jobs.job_conninfo(current.resolved_database_url)  # refuses SQLite: no workers there
    with database_sessions():  # refuses a schema that is not at head
        pass
    configure_logging(json_lines=as_json)
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, registry=cycle_metrics().registry)
    import socket  # here: no other command needs it at start-up

    label = name or socket.gethostname()
    data = {"queues": queues, "concurrency": concurrency, "metrics_port": metrics_port}
    text = f"worker {label} on queues {', '.join(queues)} (concurrency {concurrency}); Ctrl-C stops"
    emit(data | {"name": label}, as_json=as_json, text=text)
    jobs.run_worker(current, queues=queues, concurrency=concurrency, name=label)

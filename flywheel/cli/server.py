"""`flywheel init`, `flywheel db upgrade|current`, `flywheel serve`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import typer

from flywheel.cli.common import JsonOption, emit, settings
from flywheel.errors import InvalidState

if TYPE_CHECKING:
    from flywheel.settings import Settings

db = typer.Typer(help="Database schema migrations.", no_args_is_help=True)


def init(as_json: bool = JsonOption) -> None:
    """Create the workspace (.flywheel/ or FLYWHEEL_HOME) and migrate the database."""
    current = settings()
    current.home.mkdir(parents=True, exist_ok=True)
    revision = _upgrade(current.resolved_database_url)
    data = {
        "workspace": str(current.home.resolve()),
        "database": "sqlite (embedded)" if current.is_embedded else "configured URL",
        "revision": revision,
    }
    text = (
        f"workspace {data['workspace']} ready; database {data['database']} at revision {revision}\n"
        "next: flywheel tenants create NAME; flywheel serve"
    )
    emit(data, as_json=as_json, text=text)


@db.command("upgrade")
def upgrade(
    revision: str = typer.Argument("head", help="Target revision."), as_json: bool = JsonOption
) -> None:
    """Apply migrations up to REVISION (default: the latest)."""
    reached = _upgrade(settings().resolved_database_url, revision)
    emit({"revision": reached}, as_json=as_json, text=f"database at revision {reached}")


@db.command("current")
def current(as_json: bool = JsonOption) -> None:
    """Show the database's schema revision and the latest one."""
    from flywheel import migrate
    from flywheel.db import make_engine

    url = settings().resolved_database_url
    engine = make_engine(settings())
    try:
        data = {"revision": migrate.current_revision(engine), "head": migrate.head_revision(url)}
    finally:
        engine.dispose()
    emit(data, as_json=as_json, text=f"revision {data['revision']} (latest {data['head']})")


def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, min=1, max=65535, help="Port to listen on."),
    workers: int = typer.Option(1, min=1, help="Server processes."),
    access_log: bool = typer.Option(
        True, help="Log every request (uvicorn's access log); off behind a proxy that logs."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Run the REST API (uvicorn) until interrupted."""
    current = settings()
    revision = require_current_schema(current)
    url = f"http://{host}:{port}"
    data = {"url": url, "workers": workers, "revision": revision}
    emit(data, as_json=as_json, text=f"serving {url} with {workers} worker(s); Ctrl-C stops")
    _run_uvicorn(current, host, port, workers, access_log=access_log, as_json=as_json)


def require_current_schema(current: Settings) -> str | None:
    """The database's revision, if it is the latest; else InvalidState naming the fix."""
    from flywheel import migrate
    from flywheel.db import make_engine

    engine = make_engine(current)
    try:
        revision = migrate.current_revision(engine)
    finally:
        engine.dispose()
    if revision != migrate.head_revision(current.resolved_database_url):
        raise InvalidState("the database schema is not up to date: run `flywheel init` first")
    return revision


def _run_uvicorn(
    current: Settings,
    host: str,
    port: int,
    workers: int,
    *,
    access_log: bool,
    as_json: bool,
    factory: str = "api.app:create_app",
) -> None:
    import uvicorn  # imported here: only this command needs the server
    from uvicorn.config import LOGGING_CONFIG

    from flywheel.observability import json_log_config
    from flywheel.serving import BoundedHttpToolsProtocol, ServerLimits

    limits = ServerLimits.from_settings(current)
    # By import string: flywheel never imports api; uvicorn loads it in each worker.
    uvicorn.run(
        factory,
        factory=True,
        host=host,
        port=port,
        workers=workers,
        http=BoundedHttpToolsProtocol,  # head caps, deadlines and the connection cap
        ws="none",  # the API has no WebSocket routes: an upgrade would leave those bounds
        timeout_keep_alive=math.ceil(limits.idle_timeout_s),  # uvicorn's own, never sooner
        access_log=access_log,
        log_config=json_log_config() if as_json else LOGGING_CONFIG,  # JSON lines with --json
    )


def _upgrade(url: str, revision: str = "head") -> str | None:
    from sqlalchemy.exc import SQLAlchemyError

    from flywheel import migrate
    from flywheel.db import make_engine

    engine = make_engine(settings())  # before migrating: a URL it cannot use is bad input
    try:
        try:
            migrate.upgrade(url, revision)
            from flywheel.scheduling import jobs  # here: keeps the CLI's start-up fast

            jobs.ensure_schema(settings())  # procrastinate's tables, on PostgreSQL
        except SQLAlchemyError as error:
            raise InvalidState(f"could not migrate the database: {_first_line(error)}") from error
        return migrate.current_revision(engine)
    finally:
        engine.dispose()


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__

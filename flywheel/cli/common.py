"""What every command shares: settings, a session, JSON or human output, one-line errors.

Every command module imports this one at start-up (`flywheel --help` included), so it
imports only typer and the standard library; the database, the settings and rich load
inside the functions that use them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import typer

from flywheel.cli.console import progress_bar, step
from flywheel.errors import InvalidInput, InvalidState

if TYPE_CHECKING:
    import uuid

    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session, sessionmaker

    from flywheel.settings import Settings

__all__ = [
    "JsonOption",
    "as_lines",
    "cli_actor",
    "commands_use_sessions",
    "database_session",
    "database_sessions",
    "emit",
    "progress_bar",
    "resolve_tenant_id",
    "settings",
    "step",
]

JsonOption = typer.Option(False, "--json", help="Print the result as JSON.")


def settings() -> Settings:
    """The platform's settings; a bad FLYWHEEL_* value is bad input, in one line."""
    from pydantic import ValidationError

    from flywheel.settings import Settings

    try:
        return Settings()
    except ValidationError as error:
        problems = [_setting_problem(problem) for problem in error.errors(include_url=False)]
        raise InvalidInput("bad setting " + "; ".join(problems)) from error


def _setting_problem(problem: Any) -> str:
    """`FLYWHEEL_NAME: what is wrong (not 'the value')`, from one pydantic error."""
    line = f"FLYWHEEL_{'_'.join(map(str, problem['loc'])).upper()}: {problem['msg']}"
    given = problem.get("input")
    if given is not None and repr(given) not in line:
        line += f" (not {given!r})"
    return line


# Set by `commands_use_sessions`; None: commands open the configured database.
_given_sessions: ContextVar[sessionmaker[Session] | None] = ContextVar(
    "flywheel_cli_sessions", default=None
)


@contextmanager
def commands_use_sessions(sessions: sessionmaker[Session]) -> Iterator[None]:
    """Commands run in this block (in-process, in this thread) use `sessions` instead of
    opening the configured database.

    It exists for in-process callers that own the transaction: the test suite runs each
    command inside the test's one outer transaction and rolls it back afterwards, which a
    command opening its own engine could not join. The caller owns and closes `sessions`.
    """
    token = _given_sessions.set(sessions)
    try:
        yield
    finally:
        _given_sessions.reset(token)


@contextmanager
def database_sessions() -> Iterator[sessionmaker[Session]]:
    """Sessions on the configured database, refusing a schema that is not at head
    (or the sessions given by `commands_use_sessions`, as they are)."""
    given = _given_sessions.get()
    if given is not None:
        yield given
        return
    from flywheel.cli.schema import is_at_head
    from flywheel.db import make_engine, make_session_factory

    current = settings()
    engine = make_engine(current)
    try:
        if not is_at_head(engine):  # False, or None: not plain enough to tell without Alembic
            _refuse_unless_at_head(engine, current.resolved_database_url)
        yield make_session_factory(engine)
    finally:
        engine.dispose()


def _refuse_unless_at_head(engine: Engine, url: str) -> None:
    from flywheel import migrate

    revision = migrate.current_revision(engine)
    head = migrate.head_revision(url)
    if revision != head:
        raise InvalidState(
            f"database schema is at {revision or 'nothing'}, expected {head}: "
            "run `flywheel init` (or `flywheel db upgrade`)"
        )


@contextmanager
def database_session() -> Iterator[Session]:
    """One unit of work on the configured database (see `database_sessions`)."""
    from flywheel.db import unit_of_work

    with database_sessions() as sessions, unit_of_work(sessions) as session:
        yield session


def cli_actor() -> str:
    """Who an audit record names for a command: `cli:<login name>`."""
    import getpass  # here: it loads termios, which no other command needs at start-up

    return f"cli:{getpass.getuser()}"


def emit(data: Any, *, as_json: bool, text: str) -> None:
    """Print `data` as JSON, or `text` for a person."""
    if as_json:
        sys.stdout.write(json.dumps(data, default=str, indent=2) + "\n")
    else:
        sys.stdout.write(text + "\n")


def as_lines(data: dict[str, Any], indent: str = "") -> str:
    """A nested dict as indented `key: value` lines, for people (never a Python repr)."""
    lines = []
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"{indent}{key}:" + ("" if value else " none"))
            if value:
                lines.append(as_lines(value, indent + "  "))
        elif isinstance(value, list):
            lines.append(f"{indent}{key}: " + (", ".join(map(str, value)) or "none"))
        else:
            lines.append(f"{indent}{key}: {value}")
    return "\n".join(lines)


def resolve_tenant_id(session: Session, tenant: str | None) -> uuid.UUID:
    """The named tenant, or the only one there is."""
    from flywheel.tenancy import service as tenancy

    if tenant is not None:
        return tenancy.get_tenant(session=session, name=tenant).id
    tenants = tenancy.list_tenants(session=session)
    if len(tenants) != 1:
        raise InvalidInput(
            "no tenant yet: create one with `flywheel tenants create`"
            if not tenants
            else f"{len(tenants)} tenants exist: say which with --tenant"
        )
    return tenants[0].id

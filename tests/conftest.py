"""Test databases are real: PostgreSQL by default (FLYWHEEL_TEST_DB=sqlite for the embedded one).

The schema is built by running the migrations, once per session; every test starts from empty
tables. When PostgreSQL cannot be reached the tests error — they never skip.

Each test runs inside one outer transaction that is rolled back afterwards (SQLAlchemy's
"joining a Session into an external transaction"): the product's commits release savepoints,
and the app (`client`) and in-process commands (`on_test_database`) join the same connection.
A test whose rows other connections, processes or threads must see is marked
`@pytest.mark.commits("why")`: it commits for real, and the tables are emptied afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, event, make_url, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker

from api.app import create_app
from flywheel import migrate
from flywheel.cli.common import commands_use_sessions
from flywheel.db import make_engine, make_session_factory, unit_of_work
from flywheel.feedback.service import NewFeedback
from flywheel.models import Base
from flywheel.settings import Settings
from flywheel.tenancy import service as tenancy

BACKEND = os.environ.get("FLYWHEEL_TEST_DB", "postgres")
# One OpenMP thread per torch process, here and in the trainers the tests start: two test
# workers on two cores, each torch with a thread per core, made training steps many times
# slower (oversubscribed), and the learning tests' numbers were calibrated on one thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")
POSTGRES_ADMIN_URL = os.environ.get(
    "FLYWHEEL_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def pytest_report_header(config: pytest.Config) -> str:
    """The learning tests' seed, chosen from the commit: printed at the top of every run."""
    from tests.finetune.learning_seed import chosen_seed

    seed, why = chosen_seed()
    return f"learning-test seed: {seed} ({why})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On SQLite, leave out (deselect, not skip) what only PostgreSQL can show, what never
    touches the test database (training, pure functions, the quickstart's own embedded
    database) and what trains models through the platform (the acceptance demo trains through
    the embedded database end to end): the PostgreSQL pass already ran them."""
    if BACKEND != "sqlite":
        return
    kept = [
        item
        for item in items
        if item.get_closest_marker("postgres_only") is None
        and item.get_closest_marker("no_database") is None
        and item.get_closest_marker("trains") is None
        and "database_url" in getattr(item, "fixturenames", ())
    ]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept


def create_postgres_database() -> str:
    """A fresh, uniquely named database on the test server; its URL."""
    name = f"flywheel_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as error:
        raise RuntimeError(
            f"PostgreSQL tests need a server at {POSTGRES_ADMIN_URL} "
            f"(set FLYWHEEL_TEST_POSTGRES_URL): {error}"
        ) from error
    finally:
        admin.dispose()
    return make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


def drop_postgres_database(url: str) -> None:
    name = make_url(url).database
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if BACKEND == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'flywheel.db'}"
        migrate.upgrade(url)
        yield url
        return
    if BACKEND != "postgres":
        raise RuntimeError(f"FLYWHEEL_TEST_DB must be postgres or sqlite, not {BACKEND!r}")
    url = create_postgres_database()
    migrate.upgrade(url)
    yield url
    drop_postgres_database(url)


@pytest.fixture(scope="session")
def session_settings(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(
        database_url=database_url,
        home=tmp_path_factory.mktemp("home"),
        auth_cache_ttl_s=0,
        rate_limit_per_s=100_000,
        rate_limit_burst=100_000,
    )


@pytest.fixture(scope="session")
def engine(session_settings: Settings) -> Iterator[Engine]:
    """The engine of the tests' outer transactions (on SQLite, with savepoints that work)."""
    engine = make_engine(session_settings)
    if engine.dialect.name == "sqlite":
        _emit_sqlite_begin(engine)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def committing_engine(engine: Engine, session_settings: Settings) -> Iterator[Engine]:
    """The engine of tests marked `commits`, exactly as the product builds it: on SQLite the
    BEGIN workaround would change locking (a read would open the transaction, and a writer in
    WAL mode whose snapshot went stale fails with "database is locked" instead of waiting)."""
    if engine.dialect.name != "sqlite":
        yield engine
        return
    committing = make_engine(session_settings)
    yield committing
    committing.dispose()


def _emit_sqlite_begin(engine: Engine) -> None:
    """SQLAlchemy's documented pysqlite workaround, so that SAVEPOINTs work: the driver emits
    no BEGIN of its own, the engine emits one when a transaction starts. The product's
    connect settings (WAL, foreign keys, busy timeout) still apply, and are checked here."""

    @event.listens_for(engine, "connect")
    def no_driver_begin(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def emit_begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN")

    with engine.connect() as connection:
        pragmas = [
            connection.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "foreign_keys", "busy_timeout")
        ]
    if pragmas != ["wal", 1, 30000]:
        raise RuntimeError(f"the test engine lost the product's SQLite settings: {pragmas}")


@pytest.fixture
def sessions(request: pytest.FixtureRequest, engine: Engine) -> Iterator[sessionmaker[Session]]:
    """The test's sessions: inside its one outer transaction, rolled back afterwards (a commit
    releases a savepoint); for tests marked `commits`, plain sessions and emptied tables."""
    if request.node.get_closest_marker("commits") is not None:
        committing = request.getfixturevalue("committing_engine")
        yield make_session_factory(committing)
        _empty_tables(committing)
        return
    with engine.connect() as connection:
        transaction = connection.begin()
        try:
            yield sessionmaker(
                bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
            )
        finally:
            transaction.rollback()
    _refuse_leftover_rows(engine)


def _refuse_leftover_rows(engine: Engine) -> None:
    """Rows committed outside the test's transaction would leak into the next tests: empty the
    tables and fail, naming the marker the test needs."""
    tables = [table.name for table in Base.metadata.sorted_tables]
    probe = " UNION ALL ".join(
        f"SELECT '{name}' WHERE EXISTS (SELECT 1 FROM {name})" for name in tables
    )
    with engine.connect() as connection:
        filled = list(connection.exec_driver_sql(probe).scalars())
    if filled:
        _empty_tables(engine)
        pytest.fail(
            f"rows committed outside the test's transaction (in {', '.join(filled)}): "
            "another connection, process or thread wrote them; mark the test "
            '@pytest.mark.commits("why")'
        )


def _empty_tables(engine: Engine) -> None:
    tables = [table.name for table in reversed(Base.metadata.sorted_tables)]
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(text(f"TRUNCATE {', '.join(tables)} CASCADE"))
        else:
            # Checked at commit, when every row is gone (dataset versions refer to each other).
            connection.execute(text("PRAGMA defer_foreign_keys = ON"))
            for table in tables:
                connection.execute(text(f"DELETE FROM {table}"))


@pytest.fixture
def settings(session_settings: Settings) -> Settings:
    return session_settings


@pytest.fixture
def client(settings: Settings, sessions: sessionmaker[Session]) -> Iterator[TestClient]:
    with TestClient(create_app(settings, sessions=sessions)) as test_client:
        yield test_client


@dataclass(frozen=True)
class Caller:
    """A tenant with one domain and an API key, ready to send requests."""

    tenant: str
    tenant_id: uuid.UUID
    domain: str
    key: str
    key_id: uuid.UUID

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


def make_caller(
    sessions: sessionmaker[Session],
    tenant: str = "acme",
    scopes: tuple[str, ...] = ("feedback:write", "data:read"),
    domain: str = "billing",
) -> Caller:
    with unit_of_work(sessions) as session:
        owner = tenancy.create_tenant(session=session, name=tenant)
        tenancy.create_domain(session=session, tenant=owner, name=domain)
        issued = tenancy.create_api_key(session=session, tenant=owner, scopes=scopes)
    return Caller(tenant, owner.id, domain, issued.secret, issued.id)


@pytest.fixture
def acme(sessions: sessionmaker[Session]) -> Caller:
    return make_caller(sessions)


@pytest.fixture
def globex(sessions: sessionmaker[Session]) -> Caller:
    return make_caller(sessions, tenant="globex")


RATING = {
    "domain": "billing",
    "kind": "rating",
    "prompt": "p",
    "response": "r",
    "value": {"stars": 3},
}


def rating_event(stars: int) -> NewFeedback:
    """The domain-level twin of RATING, for tests that call the service directly."""
    return NewFeedback(
        kind="rating",
        value={"stars": stars},
        domain="billing",
        messages=[{"role": "user", "content": "p"}],
        response="r",
    )


def count_rows(sessions: sessionmaker[Session], table: str) -> int:
    with sessions() as session:
        return int(session.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`flywheel ARGS` through its real entry point: exit code, stdout, stderr."""
    from flywheel.cli import main

    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def on_test_database(
    database_url: str, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> Iterator[sessionmaker[Session]]:
    """The CLI's configured database is the test database; commands run in-process (`run_cli`)
    use the test's sessions, so they join its transaction."""
    monkeypatch.setenv("FLYWHEEL_DATABASE_URL", database_url)
    with commands_use_sessions(sessions):
        yield sessions


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current directory with no FLYWHEEL_* settings: the quickstart's situation."""
    for name in list(os.environ):
        if name.startswith("FLYWHEEL_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path

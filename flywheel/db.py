"""Engine, sessions and the declarative base shared by every domain's models.

One transaction owner: `unit_of_work()` (workers, CLI) or the API's request
dependency commits; services only `flush()`. `core_transaction()` owns one on a Core
connection, for services that run Core statements only.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import (
    JSON,
    DateTime,
    Index,
    MetaData,
    TypeDecorator,
    Uuid,
    create_engine,
    event,
    text,
)
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    ORMExecuteState,
    Session,
    mapped_column,
    sessionmaker,
)
from sqlalchemy.types import TypeEngine

from flywheel.errors import InvalidInput
from flywheel.settings import Settings

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class _Json(TypeDecorator[Any]):
    """JSONB on PostgreSQL, JSON text on SQLite. PostgreSQL's dialect is imported when a
    PostgreSQL connection first needs the type, not with the models: a light command on the
    embedded default saves its 20 ms of start-up (`python -m bench.cli_startup`)."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(JSON())


JsonType = _Json()


def utcnow() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite stores it naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads this class attribute
        uuid.UUID: Uuid(),
        datetime: UtcDateTime(),
        dict[str, Any]: JsonType,
        list[Any]: JsonType,
    }


class IdMixin:
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


def set_index(column: str) -> Index:
    """An index of the rows whose `column` is set (partial: rows that leave it NULL, most
    of them where several columns take turns, stay out). For a nullable foreign key that a
    delete follows: without one, each deleted parent row scans the whole table."""
    where = text(f"{column} IS NOT NULL")
    return Index(None, column, postgresql_where=where, sqlite_where=where)


def make_engine(settings: Settings) -> Engine:
    """An engine for the configured database; SQLite gets WAL and a busy timeout."""
    url = settings.resolved_database_url
    if url.startswith("sqlite"):
        settings.home.mkdir(parents=True, exist_ok=True)
        engine = _create_engine(url, connect_args={"timeout": 30})
        event.listen(engine, "connect", _configure_sqlite)
        return engine
    return _create_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=0,
        pool_pre_ping=settings.db_pool_pre_ping,
        pool_recycle=1800,
    )


def _create_engine(url: str, **options: Any) -> Engine:
    """`create_engine`, where a URL it cannot use is bad input naming the setting (never the
    URL: it may hold a password)."""
    setting = "bad setting FLYWHEEL_DATABASE_URL"
    try:
        return create_engine(url, **options)
    except (NoSuchModuleError, ImportError) as error:  # an unknown dialect, a missing driver
        raise InvalidInput(
            f"{setting}: no SQLAlchemy dialect or driver for it here ({error}); "
            "use postgresql+psycopg://user@host/db, or leave it unset for the embedded SQLite"
        ) from error
    except (ArgumentError, ValueError) as error:  # not a URL; a port that is not a number
        raise InvalidInput(
            f"{setting}: not a database URL (e.g. postgresql+psycopg://user@host/db)"
        ) from error


def _configure_sqlite(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions on `engine`. A model is mapped when the code that uses it is imported (a light
    command maps the few tables it reads); before a session writes, every table that a mapped
    table's foreign key names is mapped too (`map_referenced_tables`), so a command that
    imports one package's models only still writes (a dataset version names the forget request
    that tainted it, in another package)."""
    factory = sessionmaker(engine, expire_on_commit=False)
    event.listen(factory, "before_flush", _map_before_flush)
    event.listen(factory, "do_orm_execute", _map_before_orm_write)
    return factory


@dataclass
class _MappedTables:
    """How many tables the metadata held when every foreign key last resolved."""

    resolved: int = 0


_mapped = _MappedTables()


def map_referenced_tables() -> None:
    """Import every model (`flywheel.models`) when a mapped table's foreign key names a table
    that is not mapped yet: a flush, or an ORM bulk write, resolves the foreign keys of the
    tables it writes, and fails on one it cannot. Checked again only when tables were added."""
    tables = Base.metadata.tables
    if len(tables) == _mapped.resolved:
        return
    named = {
        key.target_fullname.rpartition(".")[0]
        for table in tables.values()
        for key in table.foreign_keys
    }
    if not named <= tables.keys():
        import flywheel.models  # noqa: F401 - registers every table; imported here: it imports db
    _mapped.resolved = len(tables)


def _map_before_flush(_session: Session, _flush: Any, _instances: Any) -> None:
    map_referenced_tables()


def _map_before_orm_write(state: ORMExecuteState) -> None:
    if not state.is_select:
        map_referenced_tables()


@contextmanager
def unit_of_work(factory: sessionmaker[Session]) -> Iterator[Session]:
    """Commit on success, roll back on any error: the one transaction owner outside requests."""
    with factory() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


@contextmanager
def core_transaction(factory: sessionmaker[Session]) -> Iterator[Connection]:
    """One transaction on a Core connection to the factory's database, committed on success,
    rolled back on any error: without the ORM Session's bookkeeping, which cost ~20 us of CPU
    per single-event API write (py-spy on a bench worker). A factory bound to a connection
    (the test suite's, inside each test's transaction) gets a savepoint of it, as its
    sessions do."""
    bind = factory.kw["bind"]
    if isinstance(bind, Connection):
        with bind.begin_nested():
            yield bind
    else:
        with bind.begin() as connection:
            yield connection


# What a domain lock serialises: feedback compiles, near-duplicate passes, dataset builds.
LockPurpose = Literal["compile", "near-duplicates", "dataset-build"]


def advisory_key(*parts: object) -> int:
    """A PostgreSQL advisory lock key (signed 64 bits) for what `parts` name."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def domain_lock(session: Session, domain_id: uuid.UUID, purpose: LockPurpose) -> None:
    """Serialise one kind of work on one domain until the transaction ends: a PostgreSQL
    advisory lock keyed by (purpose, domain), so that different purposes never block each
    other. SQLite serialises writers itself.

    A compile and a near-duplicate pass of one domain may run at once: the pass signs rows
    committed before it began, the compile writes its own; were they ever to lock rows in
    opposite orders, PostgreSQL aborts one with a deadlock error (recorded as a failed run,
    nothing written) and the next one redoes it. Dataset builds took a differently derived
    key before this helper: during a rolling upgrade an old and a new worker do not exclude
    each other's builds."""
    if session.get_bind().dialect.name == "postgresql":
        key = advisory_key(purpose, domain_id)
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})

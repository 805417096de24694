"""Migrations: one head, upgrade/downgrade/upgrade round trip, schema identical to the models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, pool, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.schema import CreateIndex

from flywheel import migrate
from flywheel.db import unit_of_work
from flywheel.feedback import service
from flywheel.models import Base, FeedbackEvent
from tests.conftest import (
    Caller,
    count_rows,
    create_postgres_database,
    drop_postgres_database,
    rating_event,
)


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres_only), "sqlite"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'migrations.db'}"
        return
    url = create_postgres_database()
    yield url
    drop_postgres_database(url)


def table_names(url: str) -> set[str]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def schema_diff(url: str) -> list[object]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def test_there_is_exactly_one_head(database_url: str) -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config(database_url))
    assert len(script.get_heads()) == 1


def test_revision_files_are_date_prefixed(database_url: str) -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config(database_url))
    for revision in script.walk_revisions():
        name = Path(revision.path).name
        assert name[:11].replace("_", "").isdigit(), name
        assert revision.revision in name


def test_round_trip_and_schema_matches_models(empty_database: str) -> None:
    migrate.upgrade(empty_database)
    assert table_names(empty_database) == set(Base.metadata.tables)
    assert schema_diff(empty_database) == []

    migrate.downgrade(empty_database, "base")
    assert table_names(empty_database) == set()

    migrate.upgrade(empty_database)
    assert table_names(empty_database) == set(Base.metadata.tables)
    assert schema_diff(empty_database) == []


def test_the_migrated_schema_has_the_models_names(empty_database: str) -> None:
    """Also the names the schema diff does not compare: primary keys, checks, foreign keys."""
    migrate.upgrade(empty_database)
    engine = create_engine(empty_database, poolclass=pool.NullPool)
    try:
        inspector = inspect(engine)
        for table in Base.metadata.tables.values():
            found = {inspector.get_pk_constraint(table.name)["name"]}
            for kind in ("foreign_keys", "unique_constraints", "check_constraints", "indexes"):
                found |= {item["name"] for item in getattr(inspector, f"get_{kind}")(table.name)}
            named = {constraint.name for constraint in table.constraints}
            assert found == named | {index.name for index in table.indexes}, table.name
    finally:
        engine.dispose()


def test_partial_indexes_are_partial_in_the_models_and_the_database(empty_database: str) -> None:
    """A model's partial index gets PostgreSQL's clause on the first PostgreSQL connection
    (`flywheel.db.partial_index`), not when it is imported: the index the models would create
    on the connected database, and the one the migrations made, both keep their WHERE."""
    migrate.upgrade(empty_database)
    engine = create_engine(empty_database, poolclass=pool.NullPool)
    stored_indexes = {
        "postgresql": "SELECT indexname, indexdef FROM pg_indexes",
        "sqlite": "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL",
    }
    try:
        with engine.connect() as connection:
            dialect = connection.dialect
            stored: dict[str, str] = dict(
                connection.execute(text(stored_indexes[dialect.name])).all()
            )
    finally:
        engine.dispose()
    partial = [
        index
        for table in Base.metadata.tables.values()
        for index in table.indexes
        if index.dialect_options["sqlite"]["where"] is not None
    ]

    assert len(partial) == 9  # runs' one running cycle; set_index's item and duplicate links
    for index in partial:
        assert " WHERE " in str(CreateIndex(index).compile(dialect=dialect)), index.name
        assert " WHERE " in stored[str(index.name)], index.name


def test_every_constraint_is_named_by_the_convention(database_url: str) -> None:
    engine = create_engine(database_url, poolclass=pool.NullPool)
    try:
        inspector = inspect(engine)
        for table in Base.metadata.tables:
            for unique in inspector.get_unique_constraints(table):
                assert (unique["name"] or "").startswith(f"uq_{table}_"), unique
            for foreign_key in inspector.get_foreign_keys(table):
                assert (foreign_key["name"] or "").startswith(f"fk_{table}_"), foreign_key
    finally:
        engine.dispose()


def test_feedback_events_refuse_updates_but_allow_deletes(
    acme: Caller, sessions: sessionmaker[Session]
) -> None:
    new = rating_event(stars=2)
    with unit_of_work(sessions) as session:
        recorded = service.record_feedback(
            connection=session.connection(), tenant_id=acme.tenant_id, new=new, idempotency_key=None
        )

    with pytest.raises(DBAPIError, match="append-only"), unit_of_work(sessions) as session:
        session.execute(text("UPDATE feedback_events SET value = '{}'"))
    with unit_of_work(sessions) as session:
        stored = session.get(FeedbackEvent, recorded.id)
        assert stored is not None
        assert stored.value == {"stars": 2}
        session.execute(text("DELETE FROM feedback_events"))
    assert count_rows(sessions, "feedback_events") == 0


def test_signal_tool_call_columns_keep_existing_rows_as_text_items(empty_database: str) -> None:
    """9c3f7a1e4b28 adds the tools and tool-call columns: an SFT example stored before it
    reads back unchanged with NULL tools and calls, and survives the downgrade."""
    migrate.upgrade(empty_database, "5b1e9c2d7a40")
    engine = create_engine(empty_database, poolclass=pool.NullPool)
    insert = text(
        "INSERT INTO tenants (id, created_at, name) VALUES (:t, CURRENT_TIMESTAMP, 'acme');"
    )
    try:
        with engine.begin() as connection:
            ids = {"t": "00000000000000000000000000000001", "d": "00000000000000000000000000000002"}
            if connection.dialect.name == "postgresql":
                ids = {key: f"00000000-0000-0000-0000-{value[-12:]}" for key, value in ids.items()}
            connection.execute(insert, ids)
            connection.execute(
                text(
                    "INSERT INTO domains (id, created_at, tenant_id, name, config) "
                    "VALUES (:d, CURRENT_TIMESTAMP, :t, 'billing', '{}')"
                ),
                ids,
            )
            connection.execute(
                text(
                    "INSERT INTO sft_examples (id, created_at, tenant_id, domain_id, source_kind,"
                    " group_key, content_sha256, ingestor_version, redaction_report, weight,"
                    " messages, completion) VALUES (:d, CURRENT_TIMESTAMP, :t, :d, 'api', 'g',"
                    " 'h', 'v', '{}', 1.0, '[]', 'the answer')"
                ),
                ids,
            )
        migrate.upgrade(empty_database)
        with engine.connect() as connection:
            row = connection.execute(
                text("SELECT completion, tools, completion_tool_calls FROM sft_examples")
            ).one()
        assert tuple(row) == ("the answer", None, None)
        migrate.downgrade(empty_database, "5b1e9c2d7a40")
        assert "tools" not in {c["name"] for c in inspect(engine).get_columns("sft_examples")}
        with engine.connect() as connection:
            found = connection.execute(text("SELECT completion FROM sft_examples")).scalar_one()
        assert found == "the answer"
    finally:
        engine.dispose()

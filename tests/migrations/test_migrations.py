"""Migrations: one head, upgrade/downgrade/upgrade round trip, schema identical to the models."""

from __future__ import annotations

import uuid
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
from flywheel.datasets.membership import version_members
from flywheel.datasets.models import DatasetVersion
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


def test_member_rows_written_per_version_read_back_as_their_version_held_them(
    empty_database: str,
) -> None:
    """ddc2b6e1f3a8 makes member rows span versions: a row written for one version before it
    spans that version only, in its stored position, and the downgrade keeps it."""
    migrate.upgrade(empty_database, "e5a9c3f1b2d7")
    engine = create_engine(empty_database, poolclass=pool.NullPool)
    is_postgres = engine.dialect.name == "postgresql"

    def uid(number: int) -> str:
        plain = f"{number:032x}"
        return str(uuid.UUID(plain)) if is_postgres else plain

    tenant, domain, v1, v2 = uid(1), uid(2), uid(3), uid(4)
    items = {name: uid(10 + n) for n, name in enumerate("abc")}
    # v1: train a, b; v2: train c then b (its curriculum order), eval a
    rows = [(v1, "train", "a", 0), (v1, "train", "b", 1)]
    rows += [(v2, "train", "c", 0), (v2, "train", "b", 1), (v2, "eval", "a", 0)]
    try:
        with engine.begin() as connection:
            run = connection.execute
            run(
                text(
                    "INSERT INTO tenants (id, created_at, name) "
                    "VALUES (:t, CURRENT_TIMESTAMP, 'acme')"
                ),
                {"t": tenant},
            )
            run(
                text(
                    "INSERT INTO domains (id, created_at, tenant_id, name, config) "
                    "VALUES (:d, CURRENT_TIMESTAMP, :t, 'billing', '{}')"
                ),
                {"d": domain, "t": tenant},
            )
            for name, item in items.items():
                run(
                    text(
                        "INSERT INTO sft_examples (id, created_at, tenant_id, domain_id, "
                        "source_kind, group_key, content_sha256, ingestor_version, "
                        "redaction_report, weight, messages, completion) VALUES (:i, "
                        "CURRENT_TIMESTAMP, :t, :d, 'api', :n, :h, 'v', '{}', 1.0, '[]', :c)"
                    ),
                    {"i": item, "t": tenant, "d": domain, "n": name, "h": name, "c": name},
                )
            for number, version in enumerate((v1, v2), start=1):
                run(
                    text(
                        "INSERT INTO dataset_versions (id, created_at, tenant_id, domain_id, "
                        "version, manifest_sha256, recipe, stats) VALUES (:v, "
                        "CURRENT_TIMESTAMP, :t, :d, :n, :h, '{\"replay_fraction\": 0.0}', '{}')"
                    ),
                    {"v": version, "t": tenant, "d": domain, "n": number, "h": str(number)},
                )
            for n, (version, split, name, position) in enumerate(rows):
                run(
                    text(
                        "INSERT INTO dataset_members (id, dataset_version_id, split, group_key, "
                        "weight, position, sft_example_id) VALUES (:i, :v, :s, :n, 1.0, :p, :x)"
                    ),
                    {"i": uid(100 + n), "v": version, "s": split, "n": name, "p": position}
                    | {"x": items[name]},
                )
        migrate.upgrade(empty_database)
        with Session(engine) as session:
            held = {
                number: [
                    (item.split, item.group_key)
                    for item in version_members(
                        session, session.get_one(DatasetVersion, uuid.UUID(version))
                    )
                ]
                for number, version in ((1, v1), (2, v2))
            }
        assert held == {
            1: [("train", "a"), ("train", "b")],
            2: [("train", "c"), ("train", "b"), ("eval", "a")],
        }
        migrate.downgrade(empty_database, "e5a9c3f1b2d7")
        with engine.connect() as connection:
            kept = connection.execute(text("SELECT count(*) FROM dataset_members")).scalar_one()
        assert kept == len(rows)
    finally:
        engine.dispose()

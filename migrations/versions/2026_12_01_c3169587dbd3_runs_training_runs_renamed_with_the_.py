"""runs: training_runs renamed, with the names of its constraints and indexes

A run is a cycle or one training, so its table is `runs`. Every name the naming convention
derives from the table's name follows it: its primary key, check constraints, foreign keys and
indexes (the partial unique index of running cycles too), and the foreign keys of the tables
that point at it. The referencing columns keep their name (`training_run_id`): it is part of
the API's, the CLI's and MLflow's wire formats.

PostgreSQL renames in place. SQLite renames the table (its other tables' references follow)
and recreates the tables whose constraint names change (batch mode).

Revision ID: c3169587dbd3
Revises: e88aa605ec8b
Create Date: 2026-12-01 08:58:11.646455
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c3169587dbd3"
down_revision: str | None = "e88aa605ec8b"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNNING_CYCLE = sa.text("method = 'cycle' AND status = 'running'")
CHECKS = {
    "method": "method IN ('sft', 'dpo', 'grpo', 'cycle')",
    "status": "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'skipped')",
}
# the run's own foreign keys: column -> (referred table, on delete)
OWN_KEYS = {
    "dataset_version_id": ("dataset_versions", "RESTRICT"),
    "domain_id": ("domains", "CASCADE"),
    "tenant_id": ("tenants", "CASCADE"),
}
# the foreign keys that point at runs: table -> (column, on delete)
REFERENCES = {
    "model_versions": ("training_run_id", "RESTRICT"),
    "scheduled_cycles": ("training_run_id", "SET NULL"),
}


def upgrade() -> None:
    _rename("training_runs", "runs")


def downgrade() -> None:
    _rename("runs", "training_runs")


def _rename(old: str, new: str) -> None:
    if op.get_context().dialect.name == "postgresql":
        _rename_in_place(old, new)
    else:
        _rename_by_copy(old, new)


def _constraints(table: str) -> list[str]:
    return [
        f"pk_{table}",
        *(f"ck_{table}_{name}" for name in CHECKS),
        *(f"fk_{table}_{column}_{referred}" for column, (referred, _) in OWN_KEYS.items()),
    ]


def _indexes(table: str) -> list[str]:
    return [f"ix_{table}_domain_id", f"uq_{table}_running_cycle"]


def _rename_in_place(old: str, new: str) -> None:
    op.rename_table(old, new)
    for old_name, new_name in zip(_constraints(old), _constraints(new), strict=True):
        op.execute(f"ALTER TABLE {new} RENAME CONSTRAINT {old_name} TO {new_name}")
    for old_name, new_name in zip(_indexes(old), _indexes(new), strict=True):
        op.execute(f"ALTER INDEX {old_name} RENAME TO {new_name}")
    for table, (column, _) in REFERENCES.items():
        op.execute(
            f"ALTER TABLE {table} RENAME CONSTRAINT fk_{table}_{column}_{old} "
            f"TO fk_{table}_{column}_{new}"
        )


def _rename_by_copy(old: str, new: str) -> None:
    for name in _indexes(old):
        op.drop_index(op.f(name), table_name=old)
    op.rename_table(old, new)  # SQLite rewrites the other tables' references to it
    with op.batch_alter_table(new, recreate="always") as batch:
        batch.drop_constraint(op.f(f"pk_{old}"), type_="primary")
        batch.create_primary_key(op.f(f"pk_{new}"), ["id"])
        for name, condition in CHECKS.items():
            batch.drop_constraint(op.f(f"ck_{old}_{name}"), type_="check")
            batch.create_check_constraint(op.f(f"ck_{new}_{name}"), condition)
        for column, (referred, ondelete) in OWN_KEYS.items():
            batch.drop_constraint(op.f(f"fk_{old}_{column}_{referred}"), type_="foreignkey")
            batch.create_foreign_key(
                op.f(f"fk_{new}_{column}_{referred}"), referred, [column], ["id"], ondelete=ondelete
            )
    op.create_index(op.f(f"ix_{new}_domain_id"), new, ["domain_id", "created_at"], unique=False)
    op.create_index(
        op.f(f"uq_{new}_running_cycle"),
        new,
        ["domain_id"],
        unique=True,
        postgresql_where=RUNNING_CYCLE,
        sqlite_where=RUNNING_CYCLE,
    )
    for table, (column, ondelete) in REFERENCES.items():
        with op.batch_alter_table(table, recreate="always") as batch:
            batch.drop_constraint(op.f(f"fk_{table}_{column}_{old}"), type_="foreignkey")
            batch.create_foreign_key(
                op.f(f"fk_{table}_{column}_{new}"), new, [column], ["id"], ondelete=ondelete
            )

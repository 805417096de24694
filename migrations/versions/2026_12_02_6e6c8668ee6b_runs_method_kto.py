"""runs: method may be kto (a training on the version's labelled completions)

PostgreSQL replaces the check constraint in place; SQLite recreates the table (batch mode).
A downgrade fails while kto runs exist (the old check refuses them): nothing is deleted.

Revision ID: 6e6c8668ee6b
Revises: 77d28e7aed8b
Create Date: 2026-12-02 10:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "6e6c8668ee6b"
down_revision: str | None = "77d28e7aed8b"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WITH_KTO = "method IN ('sft', 'dpo', 'kto', 'grpo', 'cycle')"
WITHOUT_KTO = "method IN ('sft', 'dpo', 'grpo', 'cycle')"


def upgrade() -> None:
    _replace_method_check(WITH_KTO)


def downgrade() -> None:
    _replace_method_check(WITHOUT_KTO)


def _replace_method_check(condition: str) -> None:
    if op.get_context().dialect.name == "postgresql":
        op.drop_constraint(op.f("ck_runs_method"), "runs", type_="check")
        op.create_check_constraint(op.f("ck_runs_method"), "runs", condition)
        return
    with op.batch_alter_table("runs", recreate="always") as batch:
        batch.drop_constraint(op.f("ck_runs_method"), type_="check")
        batch.create_check_constraint(op.f("ck_runs_method"), condition)

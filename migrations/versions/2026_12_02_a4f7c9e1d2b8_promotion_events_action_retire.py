"""promotion_events: action may be retire (the live watch took a worse challenger off the canary)

PostgreSQL replaces the check constraint in place; SQLite recreates the table (batch mode).
A downgrade fails while retire events exist (the old check refuses them): nothing is deleted.

Revision ID: a4f7c9e1d2b8
Revises: c98875fc1eeb
Create Date: 2026-12-02 12:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "a4f7c9e1d2b8"
down_revision: str | None = "c98875fc1eeb"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WITH_RETIRE = "action IN ('promote', 'rollback', 'auto_rollback', 'retire')"
WITHOUT_RETIRE = "action IN ('promote', 'rollback', 'auto_rollback')"


def upgrade() -> None:
    _replace_action_check(WITH_RETIRE)


def downgrade() -> None:
    _replace_action_check(WITHOUT_RETIRE)


def _replace_action_check(condition: str) -> None:
    if op.get_context().dialect.name == "postgresql":
        op.drop_constraint(op.f("ck_promotion_events_action"), "promotion_events", type_="check")
        op.create_check_constraint(
            op.f("ck_promotion_events_action"), "promotion_events", condition
        )
        return
    with op.batch_alter_table("promotion_events", recreate="always") as batch:
        batch.drop_constraint(op.f("ck_promotion_events_action"), type_="check")
        batch.create_check_constraint(op.f("ck_promotion_events_action"), condition)

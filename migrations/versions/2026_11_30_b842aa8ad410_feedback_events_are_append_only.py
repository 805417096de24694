"""feedback events are append-only: the database refuses UPDATE on feedback_events

Raw feedback is evidence; it is compiled later, never edited. Deleting stays possible (a rater
asking to be forgotten), updating does not.

Revision ID: b842aa8ad410
Revises: e2f149cbf9a1
Create Date: 2026-11-30 06:53:24.451373
"""

from collections.abc import Sequence

from alembic import op

revision: str = "b842aa8ad410"
down_revision: str | None = "e2f149cbf9a1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


MESSAGE = "feedback_events is append-only: insert a new event instead of updating one"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            f"""
            CREATE FUNCTION feedback_events_refuse_update() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION '{MESSAGE}' USING ERRCODE = 'restrict_violation';
            END
            $$
            """
        )
        op.execute(
            "CREATE TRIGGER feedback_events_append_only BEFORE UPDATE ON feedback_events "
            "FOR EACH ROW EXECUTE FUNCTION feedback_events_refuse_update()"
        )
    else:
        op.execute(
            "CREATE TRIGGER feedback_events_append_only BEFORE UPDATE ON feedback_events "
            f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
        )


def downgrade() -> None:
    op.execute(
        "DROP TRIGGER feedback_events_append_only ON feedback_events"
        if op.get_bind().dialect.name == "postgresql"
        else "DROP TRIGGER feedback_events_append_only"
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION feedback_events_refuse_update()")

"""interactions record what the gateway served

Columns on `interactions` for a call the gateway served (flywheel.inference.recording):
`release_role` (champion, challenger, pinned, base or shadow; NULL for interactions posted
through the REST API, and for every existing row), `end_user`, `status` ('ok' or 'failed',
server default 'ok', so existing and REST rows are 'ok'), `error`, `finish_reason`,
`prompt_tokens`, `completion_tokens`, `latency_ms` and `ttft_ms`. Downgrade drops them.

Revision ID: c98875fc1eeb
Revises: 5b1e9c2d7a40
Create Date: 2026-12-02 20:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c98875fc1eeb"
down_revision: str | None = "5b1e9c2d7a40"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLES = "'champion', 'challenger', 'pinned', 'base', 'shadow'"
COLUMNS = (
    "release_role",
    "end_user",
    "status",
    "error",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "latency_ms",
    "ttft_ms",
)


def upgrade() -> None:
    with op.batch_alter_table("interactions") as batch:
        batch.add_column(sa.Column("release_role", sa.String(16), nullable=True))
        batch.add_column(sa.Column("end_user", sa.String(255), nullable=True))
        batch.add_column(
            sa.Column("status", sa.String(16), nullable=False, server_default=sa.text("'ok'"))
        )
        batch.add_column(sa.Column("error", sa.Text(), nullable=True))
        batch.add_column(sa.Column("finish_reason", sa.String(32), nullable=True))
        batch.add_column(sa.Column("prompt_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("completion_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("latency_ms", sa.Float(), nullable=True))
        batch.add_column(sa.Column("ttft_ms", sa.Float(), nullable=True))
        batch.create_check_constraint(
            op.f("ck_interactions_release_role"), f"release_role IN ({ROLES})"
        )
        batch.create_check_constraint(op.f("ck_interactions_status"), "status IN ('ok', 'failed')")


def downgrade() -> None:
    with op.batch_alter_table("interactions") as batch:
        batch.drop_constraint(op.f("ck_interactions_status"), type_="check")
        batch.drop_constraint(op.f("ck_interactions_release_role"), type_="check")
        for column in reversed(COLUMNS):
            batch.drop_column(column)

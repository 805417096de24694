"""dataset_members_span_versions: a member row spans versions, so a version stores what changed

Each version used to write a row for every item it held: its whole eval set and a fresh replay
draw of everything trained before, a third of a domain's items again every week. A row now
spans the versions from the one that added it (`dataset_version_id`) to `until_version` (the
first that no longer holds it); a train row of that span is held by its first version when
the item was new there (`is_new`), and by each later version whose replay draw picks it
(flywheel.datasets.membership). `ease` is the curriculum's order key, read with the content
hash, where `position` was written per version; the row keeps its item's `content_sha256`, so a
read draws and orders from member rows alone.

Existing rows were written per version: each spans its own version only (`until_version` =
its version + 1, `is_new`), and keeps its `position` (no content hash: never drawn). Downgrade refuses while a row spans
versions (written by the new rules): only a rebuild could write those per version again.

Revision ID: ddc2b6e1f3a8
Revises: e5a9c3f1b2d7
Create Date: 2026-12-06 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "ddc2b6e1f3a8"
down_revision: str | None = "e5a9c3f1b2d7"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("dataset_members") as batch:
        batch.add_column(sa.Column("until_version", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("is_new", sa.Boolean(), nullable=False, server_default=sa.true())
        )
        batch.add_column(sa.Column("ease", sa.Float(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("content_sha256", sa.String(length=64), nullable=True))
    op.execute(
        "UPDATE dataset_members SET until_version = (SELECT dataset_versions.version + 1 "
        "FROM dataset_versions WHERE dataset_versions.id = dataset_members.dataset_version_id)"
    )
    with op.batch_alter_table("dataset_members") as batch:
        batch.alter_column("is_new", server_default=None)
        batch.alter_column("ease", server_default=None)


def downgrade() -> None:
    spanning = op.get_bind().execute(
        sa.text("SELECT count(*) FROM dataset_members WHERE position IS NULL")
    )
    if spanning.scalar_one():
        raise RuntimeError(
            "dataset_members holds rows that span versions, which the older schema cannot "
            "hold: delete the dataset versions built since this migration before downgrading"
        )
    with op.batch_alter_table("dataset_members") as batch:
        batch.drop_column("content_sha256")
        batch.drop_column("ease")
        batch.drop_column("is_new")
        batch.drop_column("until_version")

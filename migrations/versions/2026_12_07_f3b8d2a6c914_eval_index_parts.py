"""eval_index_parts: a domain's eval index kept between processes

A build checks train candidates against the index of the eval set (flywheel.datasets.overlap).
It was kept in the building process only, so a build in a fresh process (a worker, the CLI)
read every eval item's sketch again to index it: about 3 s for 100k eval items. The index is
now kept in parts, each the eval items it covers with their distinct n-gram hashes and
signatures; a build reads the parts and writes one for the items it added. A new table only;
downgrade drops it (builds then index from the sketches again). On PostgreSQL its byte columns
are stored uncompressed: hashes do not compress.

Revision ID: f3b8d2a6c914
Revises: ddc2b6e1f3a8
Create Date: 2026-12-07 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f3b8d2a6c914"
down_revision: str | None = "ddc2b6e1f3a8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BYTES = ("items", "grams", "signatures")


def upgrade() -> None:
    op.create_table(
        "eval_index_parts",
        sa.Column("domain_id", sa.Uuid(), nullable=False),
        sa.Column("rules", sa.String(length=255), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("covers", sa.String(length=64), nullable=False),
        sa.Column("item_count", sa.Integer(), nullable=False),
        *(sa.Column(column, sa.LargeBinary(), nullable=False) for column in BYTES),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["domain_id"],
            ["domains.id"],
            name=op.f("fk_eval_index_parts_domain_id_domains"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_index_parts")),
    )
    op.create_index(
        op.f("ix_eval_index_parts_domain_id"), "eval_index_parts", ["domain_id"], unique=False
    )
    if op.get_bind().dialect.name == "postgresql":
        for column in BYTES:
            op.execute(f"ALTER TABLE eval_index_parts ALTER COLUMN {column} SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_index(op.f("ix_eval_index_parts_domain_id"), table_name="eval_index_parts")
    op.drop_table("eval_index_parts")

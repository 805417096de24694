"""dataset groups, labeled members, member weights and order

Revision ID: 6c4095906c0a
Revises: 19765dee3014
Create Date: 2026-11-30 09:43:40.799555
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "6c4095906c0a"
down_revision: str | None = "19765dee3014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _exactly_one(columns: tuple[str, ...]) -> str:
    return (
        " + ".join(f"(CASE WHEN {column} IS NULL THEN 0 ELSE 1 END)" for column in columns) + " = 1"
    )


THREE_ITEMS = ("sft_example_id", "preference_pair_id", "verifiable_task_id")
FOUR_ITEMS = (*THREE_ITEMS, "labeled_completion_id")


def upgrade() -> None:
    op.create_table(
        "dataset_groups",
        sa.Column("domain_id", sa.Uuid(), nullable=False),
        sa.Column("group_key", sa.String(length=255), nullable=False),
        sa.Column("split", sa.String(length=8), nullable=False),
        sa.Column("first_version_id", sa.Uuid(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("split IN ('train', 'eval')", name=op.f("ck_dataset_groups_split")),
        sa.ForeignKeyConstraint(
            ["domain_id"],
            ["domains.id"],
            name=op.f("fk_dataset_groups_domain_id_domains"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["first_version_id"],
            ["dataset_versions.id"],
            name=op.f("fk_dataset_groups_first_version_id_dataset_versions"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset_groups")),
        sa.UniqueConstraint(
            "domain_id", "group_key", name=op.f("uq_dataset_groups_domain_id_group_key")
        ),
    )
    with op.batch_alter_table("dataset_members") as batch:
        batch.add_column(sa.Column("labeled_completion_id", sa.Uuid(), nullable=True))
        batch.add_column(sa.Column("weight", sa.Float(), nullable=True))
        batch.add_column(sa.Column("position", sa.Integer(), nullable=True))
        batch.create_foreign_key(
            batch.f("fk_dataset_members_labeled_completion_id_labeled_completions"),
            "labeled_completions",
            ["labeled_completion_id"],
            ["id"],
            ondelete="CASCADE",
        )
        batch.drop_constraint(batch.f("ck_dataset_members_exactly_one_item"), type_="check")
        batch.create_check_constraint(
            batch.f("ck_dataset_members_exactly_one_item"), _exactly_one(FOUR_ITEMS)
        )
    with op.batch_alter_table("dataset_versions") as batch:
        batch.add_column(sa.Column("eval_sha256", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dataset_versions") as batch:
        batch.drop_column("eval_sha256")
    with op.batch_alter_table("dataset_members") as batch:
        batch.drop_constraint(batch.f("ck_dataset_members_exactly_one_item"), type_="check")
        batch.create_check_constraint(
            batch.f("ck_dataset_members_exactly_one_item"), _exactly_one(THREE_ITEMS)
        )
        batch.drop_constraint(
            batch.f("fk_dataset_members_labeled_completion_id_labeled_completions"),
            type_="foreignkey",
        )
        batch.drop_column("position")
        batch.drop_column("weight")
        batch.drop_column("labeled_completion_id")
    op.drop_table("dataset_groups")

"""item_sketches: each item's decontamination sketch, computed once

`item_sketches` holds, per item and n-gram length, the hash of its prompt key, its distinct
hashed n-grams and its MinHash signature over the text decontamination compares
(flywheel.datasets.sketches), with the version of the rules that made it. Exactly one item
column is set (cascade: deleting an item deletes its sketch). A new table only: builds fill
it for items that lack a sketch; downgrade drops it.

Revision ID: c81322ba7f18
Revises: c37d41a273ac
Create Date: 2026-12-04 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c81322ba7f18"
down_revision: str | None = "c37d41a273ac"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ITEMS = {
    "sft_example_id": "sft_examples",
    "preference_pair_id": "preference_pairs",
    "verifiable_task_id": "verifiable_tasks",
    "labeled_completion_id": "labeled_completions",
}


def upgrade() -> None:
    one = " + ".join(f"(CASE WHEN {column} IS NULL THEN 0 ELSE 1 END)" for column in ITEMS)
    op.create_table(
        "item_sketches",
        sa.Column("sketcher", sa.Integer(), nullable=False),
        sa.Column("ngram_words", sa.Integer(), nullable=False),
        sa.Column("prompt_key", sa.String(length=64), nullable=False),
        sa.Column("grams", sa.LargeBinary(), nullable=False),
        sa.Column("signature", sa.LargeBinary(), nullable=False),
        *(sa.Column(column, sa.Uuid(), nullable=True) for column in ITEMS),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(f"{one} = 1", name=op.f("ck_item_sketches_exactly_one_item")),
        *(
            sa.ForeignKeyConstraint(
                [column],
                [f"{table}.id"],
                name=op.f(f"fk_item_sketches_{column}_{table}"),
                ondelete="CASCADE",
            )
            for column, table in ITEMS.items()
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_item_sketches")),
        *(
            sa.UniqueConstraint(
                column, "ngram_words", name=op.f(f"uq_item_sketches_{column}_ngram_words")
            )
            for column in ITEMS
        ),
    )
    op.create_index(op.f("ix_item_sketches_prompt_key"), "item_sketches", ["prompt_key"])


def downgrade() -> None:
    op.drop_index(op.f("ix_item_sketches_prompt_key"), table_name="item_sketches")
    op.drop_table("item_sketches")

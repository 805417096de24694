"""Alembic environment: runs revisions against the configured database.

The URL comes from `config.attributes["url"]` (set by `flywheel db upgrade`), else
`FLYWHEEL_DATABASE_URL` through Settings — never from alembic.ini, so no secret lives in a file.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from flywheel.models import Base
from flywheel.settings import Settings

config = context.config
target_metadata = Base.metadata


def _ours(name: str | None, type_: str, _parent: object) -> bool:
    """procrastinate's job tables belong to procrastinate (`flywheel db upgrade` applies its
    schema), not to our migrations: `alembic check` leaves them alone."""
    return not (type_ == "table" and (name or "").startswith("procrastinate_"))


def run_migrations() -> None:
    url = config.attributes.get("url") or Settings().resolved_database_url
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
            include_name=_ours,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations()

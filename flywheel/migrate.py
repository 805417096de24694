"""Run the Alembic migrations shipped with Flywheel (`flywheel db upgrade`)."""

from __future__ import annotations

import importlib.util

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

from flywheel.errors import InvalidState


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at the installed `migrations` directory and at `url`."""
    spec = importlib.util.find_spec("migrations")
    if spec is None or not spec.submodule_search_locations:
        raise InvalidState("the migrations package is not installed beside flywheel")
    config = Config()
    config.set_main_option("script_location", spec.submodule_search_locations[0])
    config.attributes["url"] = url
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision(url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()

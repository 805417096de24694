"""Is the database's schema at the latest revision? Asked by every command that opens the
database, so it is answered without Alembic when it can be (importing Alembic costs about a
quarter of a light command's start-up): the database's `alembic_version` row by plain SQL,
the head from the revision files read as text. Anything less plain (no version table, several
rows, a merge revision, a file whose ids do not read) is left to Alembic (`flywheel.migrate`).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

_REVISION = re.compile(r"^revision(?:\s*:\s*str)?\s*=\s*[\"'](\w+)[\"']\s*$", re.MULTILINE)
_DOWN_REVISION = re.compile(
    r"^down_revision(?:\s*:[^=\n]+)?\s*=\s*(?:None|[\"'](\w+)[\"'])\s*$", re.MULTILINE
)


def is_at_head(engine: Engine) -> bool | None:
    """True or False when both revisions read plainly; None: ask Alembic."""
    head = head_from_files()
    if head is None:
        return None
    current = _current_from_table(engine)
    return None if current is None else current == head


def head_from_files(versions: Path | None = None) -> str | None:
    """The one head of the shipped revision files, or None when that is not plain to see."""
    folder = versions or _versions_folder()
    if folder is None:
        return None
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in folder.glob("*.py"):
        if path.name.startswith("__"):  # __init__.py: not a revision
            continue
        text = path.read_text(encoding="utf-8")
        found, down = _REVISION.findall(text), _DOWN_REVISION.findall(text)
        if len(found) != 1 or len(down) != 1:
            return None
        revisions.add(found[0])
        parents |= {down[0]} - {""}
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 and parents <= revisions else None


def _versions_folder() -> Path | None:
    spec = importlib.util.find_spec("migrations")  # found, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(spec.submodule_search_locations[0]) / "versions"
    return folder if folder.is_dir() else None


def _current_from_table(engine: Engine) -> str | None:
    """The one revision in `alembic_version`; None when there is no such table or not one row
    (an unreachable database raises, as Alembic would)."""
    from sqlalchemy import inspect, text

    with engine.connect() as connection:
        if not inspect(connection).has_table("alembic_version"):
            return None
        rows = connection.execute(text("SELECT version_num FROM alembic_version")).all()
    return str(rows[0][0]) if len(rows) == 1 else None

"""The CLI's Alembic-free "is the schema at head?" reads the same head as Alembic, and leaves
anything less plain to Alembic."""

from __future__ import annotations

from pathlib import Path

from flywheel import migrate
from flywheel.cli.schema import head_from_files

REVISION = '''"""{name}"""
revision: str = "{revision}"
down_revision: str | None = {down}
'''


def write(folder: Path, revision: str, down: str) -> None:
    text = REVISION.format(name=revision, revision=revision, down=down)
    (folder / f"2026_01_01_{revision}.py").write_text(text, encoding="utf-8")


def test_the_shipped_head_is_alembics() -> None:
    assert head_from_files() == migrate.head_revision("sqlite://")


def test_a_chain_has_its_last_revision_as_head(tmp_path: Path) -> None:
    write(tmp_path, "aaa", "None")
    write(tmp_path, "bbb", '"aaa"')
    write(tmp_path, "ccc", '"bbb"')
    (tmp_path / "__init__.py").write_text("", encoding="utf-8")

    assert head_from_files(tmp_path) == "ccc"


def test_what_is_not_plain_is_left_to_alembic(tmp_path: Path) -> None:
    write(tmp_path, "aaa", "None")
    write(tmp_path, "bbb", '"aaa"')
    write(tmp_path, "ccc", '"aaa"')  # two heads
    assert head_from_files(tmp_path) is None

    merge = tmp_path / "merge"
    merge.mkdir()
    write(merge, "aaa", "None")
    write(merge, "bbb", '("aaa", "zzz")')  # a merge revision: its parents are a tuple
    assert head_from_files(merge) is None

    assert head_from_files(tmp_path / "empty-and-missing") is None

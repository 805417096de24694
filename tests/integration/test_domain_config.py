"""`flywheel domains configure`: a domain's configuration is checked before it is stored; a
bad file or a bad cycle section is one line, and the stored configuration stays as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.models import Domain
from tests.conftest import Caller, run_cli

GOOD = """
base_model: /models/base
gate: {min_items: 10}
cycle:
  methods: [sft, dpo]
  overrides: {sft: [max_steps=10]}
  schedule: "30 4 * * 0"
  min_new_signal: 5
"""


def stored(sessions: sessionmaker[Session]) -> dict[str, object]:
    with sessions() as session:
        return dict(session.scalars(select(Domain)).one().config)


def test_a_good_configuration_is_stored(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "billing.yaml"
    path.write_text(GOOD, encoding="utf-8")

    code, out, err = run_cli(
        capsys, "domains", "configure", "billing", "--tenant", "acme", "--file", str(path), "--json"
    )

    assert code == 0, err
    assert json.loads(out)["config"]["cycle"]["methods"] == ["sft", "dpo"]
    config = stored(on_test_database)
    assert config["gate"] == {"min_items": 10}
    assert config["cycle"]["schedule"] == "30 4 * * 0"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cycle: {schedule: 'every monday'}", "not a cron expression"),
        ("cycle: {methods: [sft, ppo]}", "cycle config: methods.1"),
        ("cycle: {retries: 3}", "cycle config: retries: Extra inputs are not permitted"),
        ("cycle: {min_new_signal: -1}", "min_new_signal"),
        ("- just\n- a list", "must hold a mapping, not list"),
        ("cycle: {methods: [sft", "cannot read"),
    ],
)
def test_a_bad_configuration_is_refused_and_nothing_changes(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    text: str,
    message: str,
) -> None:
    before = stored(on_test_database)
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")

    code, _, err = run_cli(
        capsys, "domains", "configure", "billing", "--tenant", "acme", "--file", str(path)
    )

    assert code != 0
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert stored(on_test_database) == before


def test_an_unknown_domain_is_one_line(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("gate: {}", encoding="utf-8")

    code, _, err = run_cli(
        capsys, "domains", "configure", "nope", "--tenant", "acme", "--file", str(path)
    )

    assert code == 2
    assert "nope" in err

"""Small pilots on a real database: a build whose eval split is empty or below the gate's
minimum says so with the fix (text and --json); a later, larger eval fraction places only new
groups; a domain's `dataset.min_eval_items` makes new groups fill eval first, deterministically;
`flywheel eval` stops before scoring an eval split with nothing to score."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.models import DatasetGroup
from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.datasets.split import hashed_split, position_of
from flywheel.db import unit_of_work
from flywheel.errors import InvalidInput
from flywheel.models import Domain, ModelVersion
from tests.conftest import Caller, run_cli
from tests.integration.test_dataset_build import domain_of, groups_in, members, sft, store
from tests.integration.test_eval_lineage import candidate

PILOT = 15  # thread groups, one SFT example each


def pilot(sessions: sessionmaker[Session], caller: Caller, count: int = PILOT) -> list[str]:
    """`count` groups the default fraction (0.1) places in train: the issue's empty eval."""
    groups = list(groups_in("train", domain_of(sessions, caller), count, prefix="ticket"))
    store(sessions, caller, [sft(group, question(group)) for group in groups])
    return groups


def question(group: str) -> str:
    """Words of its own, so that no two questions are near-duplicates (decontamination)."""
    digest = hashlib.sha256(group.encode()).hexdigest()
    return " ".join(digest[start : start + 6] for start in range(0, 48, 6))


def configure(
    sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str], tmp: Path, text: str
) -> tuple[int, str]:
    path = tmp / "billing.yaml"
    path.write_text(text, encoding="utf-8")
    code, _, err = run_cli(
        capsys, "domains", "configure", "billing", "--tenant", "acme", "--file", str(path)
    )
    return code, err


def placed(sessions: sessionmaker[Session], caller: Caller) -> dict[str, str]:
    with sessions() as session:
        rows = session.execute(
            select(DatasetGroup.group_key, DatasetGroup.split).where(
                DatasetGroup.domain_id == domain_of(sessions, caller)
            )
        )
        return {str(key): str(split) for key, split in rows}


def test_a_pilot_with_an_empty_eval_split_is_told_so_with_the_fix(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    pilot(on_test_database, acme)

    code, out, err = run_cli(capsys, "dataset", "build", "--domain", "billing")

    assert code == 0, err
    assert out.splitlines() == ["built billing v1: train 15 items (15 sft) in 15 groups; "
                                "eval 0 items in 0 groups"]  # fmt: skip
    (warning,) = err.strip().splitlines()
    assert warning.startswith("warning: v1's eval split is empty: `flywheel eval` has nothing")
    assert "The 15 groups already placed (15 train, 0 eval) keep their split" in warning
    assert "`dataset: {min_eval_items: 30}` in billing's config" in warning
    assert "--eval-fraction" in warning
    assert "`flywheel models promote --force`" in warning

    code, out, err = run_cli(
        capsys, "dataset", "build", "--domain", "billing", "--eval-fraction", "0.5", "--json"
    )

    assert code == 0, err
    again = json.loads(out)
    assert (again["version"], again["is_new"]) == (1, False)
    assert again["warnings"] == [warning.removeprefix("warning: ")]
    assert err == ""  # with --json the warnings are in the JSON only
    assert set(placed(on_test_database, acme).values()) == {"train"}


def test_a_larger_fraction_later_places_only_new_groups(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    sessions = on_test_database
    old = pilot(sessions, acme)
    assert run_cli(capsys, "dataset", "build", "--domain", "billing")[0] == 0
    domain_id = domain_of(sessions, acme)
    new = [f"later-{number}" for number in range(20)]
    store(sessions, acme, [sft(group, question(group)) for group in new])

    code, out, err = run_cli(
        capsys, "dataset", "build", "--domain", "billing", "--eval-fraction", "0.5", "--json"
    )

    assert code == 0, err
    built = json.loads(out)
    assert built["version"] == 2
    splits = placed(sessions, acme)
    assert all(splits[group] == "train" for group in old)  # never moved to eval
    assert {group: splits[group] for group in new} == {
        group: hashed_split(domain_id, group, 0.5) for group in new
    }
    expected_eval = sum(splits[group] == "eval" for group in new)
    assert expected_eval > 0
    assert built["stats"]["eval"] == {"sft": expected_eval}
    assert all("eval split is empty" not in warning for warning in built["warnings"])


def test_a_domain_minimum_fills_eval_first_and_builds_stay_deterministic(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    sessions = on_test_database
    code, err = configure(sessions, capsys, tmp_path, "dataset: {min_eval_items: 4}\n"
                          "gate: {min_items: 4}\n")  # fmt: skip
    assert code == 0, err
    groups = pilot(sessions, acme)
    domain_id = domain_of(sessions, acme)
    by_position = sorted(groups, key=lambda group: position_of(domain_id, group))

    def manifest() -> str:
        with sessions() as session:  # built and rolled back: nothing stays
            built = build_dataset_version(
                session=session,
                tenant_id=acme.tenant_id,
                domain_id=domain_id,
                recipe=DatasetRecipe(),
            )
            session.rollback()
            return built.version.manifest_sha256

    assert manifest() == manifest()
    code, out, err = run_cli(capsys, "dataset", "build", "--domain", "billing", "--json")

    assert code == 0, err
    built = json.loads(out)
    assert built["manifest_sha256"] == manifest()
    assert built["stats"]["eval"] == {"sft": 4}
    assert built["stats"]["min_eval_items"] == 4
    assert built["warnings"] == []
    splits = placed(sessions, acme)
    assert [group for group in by_position if splits[group] == "eval"] == by_position[:4]
    assert members(sessions, uuid.UUID(built["id"]))["eval"]

    # the minimum is met: new groups are placed by the fraction alone
    new = [f"later-{number}" for number in range(10)]
    store(sessions, acme, [sft(group, question(group)) for group in new])
    assert run_cli(capsys, "dataset", "build", "--domain", "billing")[0] == 0
    splits = placed(sessions, acme)
    assert {group: splits[group] for group in new} == {
        group: hashed_split(domain_id, group, 0.1) for group in new
    }


def test_an_eval_split_below_the_gate_minimum_is_told_so(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    code, err = configure(on_test_database, capsys, tmp_path, "dataset: {min_eval_items: 3}\n")
    assert code == 0, err
    pilot(on_test_database, acme)

    code, out, err = run_cli(capsys, "dataset", "build", "--domain", "billing", "--json")

    assert code == 0, err
    (warning,) = json.loads(out)["warnings"]
    assert warning.startswith(
        "v1's eval split has 3 items the gate scores on exact_match, fewer than its minimum "
        "of 30 (gate.min_items): every candidate will be refused."
    )
    assert "`dataset: {min_eval_items: 30}`" in warning
    assert "(12 train, 3 eval)" in warning


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dataset: {min_eval_items: -1}", "dataset config: min_eval_items: Input should be"),
        ("dataset: {min_eval_items: many}", "dataset config: min_eval_items: Input should be"),
        ("dataset: {min_eval_groups: 3}", "dataset config: min_eval_groups: Extra inputs"),
    ],
)
def test_a_bad_dataset_config_is_one_line_and_is_not_stored(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    text: str,
    message: str,
) -> None:
    code, err = configure(on_test_database, capsys, tmp_path, text)
    assert code != 0
    assert message in err
    assert len(err.strip().splitlines()) == 1
    with on_test_database() as session:
        assert session.scalars(select(Domain.config)).one() == {}


def test_a_bad_dataset_config_stored_before_is_refused_at_build(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    with unit_of_work(sessions) as session:
        session.execute(update(Domain).values(config={"dataset": {"min_eval_items": -2}}))
    domain_id = domain_of(sessions, acme)
    with (
        pytest.raises(InvalidInput, match="billing's dataset config: min_eval_items"),
        unit_of_work(sessions) as session,
    ):
        build_dataset_version(
            session=session, tenant_id=acme.tenant_id, domain_id=domain_id, recipe=DatasetRecipe()
        )


def test_eval_stops_before_scoring_an_empty_eval_split(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's `flywheel eval` that failed 13 s later: now it fails before fetching the
    adapter or starting a model, naming the fix."""
    pilot(on_test_database, acme)
    assert run_cli(capsys, "dataset", "build", "--domain", "billing")[0] == 0
    with unit_of_work(on_test_database) as session:
        domain = session.scalars(select(Domain)).one()
        built = build_dataset_version(
            session=session, tenant_id=acme.tenant_id, domain_id=domain.id, recipe=DatasetRecipe()
        )
        candidate(session, acme, built.version.id)

    code, out, err = run_cli(capsys, "eval", "--domain", "billing")

    assert code == 1
    assert out == ""
    assert err.strip().splitlines() == [
        "error: dataset v1 of billing has no eval item to score (its eval split holds nothing): "
        "build a version with an eval split (`dataset: {min_eval_items: 30}` in the domain's "
        "config makes new groups fill eval first; groups already placed keep their split), "
        "then evaluate"
    ]
    with on_test_database() as session:
        assert session.scalars(select(ModelVersion.gate_result)).one() == {}

"""`flywheel eval` end to end: a trained, registered adapter is scored against the base model
on the domain's frozen eval set through the subprocess; per-item scores and the gate's
decision are stored on the version, the verdict is tagged in MLflow, and `promote` honours it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from flywheel.cli.evaluate import REFUSED
from flywheel.datasets.reader import version_lineage
from flywheel.db import unit_of_work
from flywheel.models import Domain, ModelVersion
from tests.conftest import Caller, run_cli
from tests.finetune.test_train_cli import QUICK, build_version

pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated:FutureWarning"
    ),
    pytest.mark.trains,
]


def test_eval_scores_gates_and_stores_the_decision(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    plain_base: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sessions = on_test_database
    dataset = build_version(sessions, acme)
    with unit_of_work(sessions) as session:  # a small eval set: let the gate judge it
        session.execute(update(Domain).values(config={"gate": {"min_items": 2}}))
        eval_items = {
            row["item_id"] for row in version_lineage(session, dataset) if row["split"] == "eval"
        }
    code, out, err = run_cli(
        capsys, "train", "sft", "--domain", "billing", "--base", str(plain_base), *QUICK, "--json"
    )
    assert code == 0, err
    run_dir = Path(json.loads(out)["run_dir"])

    code, out, err = run_cli(
        capsys, "eval", "--domain", "billing", "--max-new-tokens", "4", "--k", "2", "--json"
    )

    result = json.loads(out)
    assert code == (0 if result["is_promotable"] else REFUSED), err  # a refusal exits 3
    assert (result["version"], result["against"]) == ("1", "base")
    assert set(result["summary"]) >= {"exact_match", "preference_accuracy"}
    with sessions() as session:
        version = session.scalars(select(ModelVersion)).one()
    stored = version.eval_results
    assert stored["dataset_version"] == dataset.version
    assert (
        set(stored["scores"]["preference_accuracy"]) | set(stored["scores"]["exact_match"])
        == eval_items
    )  # every eval item scored, by id
    assert stored["against"]["version"] == "base"
    gate = version.gate_result
    assert gate["is_promoted"] == result["is_promotable"]
    assert gate["evidence"]["primary"]["metric"] == "preference_accuracy"
    if not gate["is_promoted"]:  # two training steps rarely beat the base: promote refuses
        assert gate["reasons"]
        code, _, err = run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")
        assert code != 0
        assert "did not pass its gate" in err
    tracking = f"sqlite:///{run_dir.parents[1] / 'mlflow.db'}"
    tags = MlflowClient(tracking_uri=tracking).get_model_version("acme.billing", "1").tags
    assert tags["flywheel.gate"].endswith("against base")


def test_eval_exits_3_when_the_gate_refuses_and_explains_its_minimum(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    plain_base: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A gate minimum no eval set of this size meets: refused every time, whatever the scores;
    the refusal says what minimum, what was there and how to fix it; --report-only exits 0."""
    sessions = on_test_database
    dataset = build_version(sessions, acme)
    with unit_of_work(sessions) as session:
        session.execute(update(Domain).values(config={"gate": {"min_items": 1000}}))
    code, _, err = run_cli(
        capsys, "train", "sft", "--domain", "billing", "--base", str(plain_base), *QUICK
    )
    assert code == 0, err
    pairs = dataset.stats["eval"]["pair"]
    args = ("eval", "--domain", "billing", "--max-new-tokens", "4", "--k", "2")

    code, out, err = run_cli(capsys, *args)

    assert code == REFUSED, err
    assert "error:" not in err  # a refusal is an outcome, not an error
    assert "billing v1 does not pass the gate against base" in out
    assert (
        f"  - only {pairs} items were scored on preference_accuracy; the gate needs at least "
        "1000 (its min_items): add eval data"
    ) in out
    assert "`flywheel models promote --force`" in out

    code, out, err = run_cli(capsys, *args, "--report-only", "--json")

    assert code == 0, err
    assert json.loads(out)["is_promotable"] is False

"""A suite's GRPO run logs its task reward and its probe loss per member domain, each logging
step (finetune.suite_logging): interference between members is visible in MLflow."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from finetune import synthetic
from finetune.__main__ import main
from finetune.suite_logging import METRICS_FILE
from tests.finetune.conftest import TRAINING, answer_record, write_export

pytestmark = TRAINING
GRPO_QUICK = ["max_steps=4", "per_device_train_batch_size=4", "logging_steps=1", "save_steps=2",
              "num_generations=2", "max_completion_length=4", "canary_fraction=0"]  # fmt: skip


def suite_export(root: Path) -> Path:
    """Answer tasks of two domains, tagged and sectioned as flywheel.suites writes them."""
    problems = synthetic.split_problems().train[:16]
    write_export(root, tasks=[answer_record(p) for p in problems], domain="support")
    path = root / "train" / "grpo.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for index, row in enumerate(rows):
        row["domain"] = "billing" if index % 2 else "shipping"
    data = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
    path.write_text(data)
    manifest = json.loads((root / "manifest.json").read_text())
    entry = manifest["export"]["files"]["train/grpo.jsonl"]
    entry["sha256"], entry["bytes"] = hashlib.sha256(data.encode()).hexdigest(), len(data)
    manifest["suite"] = {"name": "support", "members": {"billing": {}, "shipping": {}}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.mark.usefixtures("no_sandbox")
def test_a_suites_grpo_run_logs_reward_and_loss_per_domain(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, plain_base: Path, mlflow_store: str
) -> None:
    export = suite_export(tmp_path / "export")

    code = main(["grpo", "--dataset", str(export), "--base", str(plain_base),
                 "--out", str(tmp_path / "job"), *GRPO_QUICK])  # fmt: skip

    captured = capsys.readouterr()
    assert code == 0, captured.err
    run_id = json.loads(captured.out.strip().splitlines()[-1])["mlflow_run_id"]
    client = MlflowClient(tracking_uri=mlflow_store)
    generated = {point.step for point in client.get_metric_history(run_id, "reward")}
    assert generated  # TRL's own reward, logged on the steps that generated
    seen: set[int] = set()
    for domain in ("billing", "shipping"):
        # a domain's reward on the steps whose batches drew its tasks (two prompts a step)
        reward = client.get_metric_history(run_id, f"domain.{domain}.reward")
        assert reward
        assert {point.step for point in reward} <= generated
        assert all(0 <= point.value <= 1 for point in reward)
        seen |= {point.step for point in reward}
        loss = client.get_metric_history(run_id, f"domain.{domain}.loss")
        assert [point.step for point in loss] == [0, 1, 2, 3, 4]
    assert seen == generated
    lines = (tmp_path / "job" / METRICS_FILE).read_text().splitlines()
    assert {json.loads(line)["domain"] for line in lines} == {"billing", "shipping"}

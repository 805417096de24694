"""The recipes end to end on a tiny model: `python -m finetune` trains from an export, seals
checkpoints, resumes to the same losses after a SIGTERM, and leaves a complete MLflow run with
the adapter; bad input is one line and exit status 2 before any training."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import mlflow
import pytest
from mlflow.tracking import MlflowClient

import finetune.job
from finetune import synthetic
from finetune.__main__ import main
from finetune.checkpoint import MANIFEST, StopOnSignal, is_complete, latest_complete
from finetune.config import load_config
from finetune.dynamic_sampling import FILTERED_SHARE
from finetune.job import INTERRUPTED_EXIT, Job
from finetune.sft import train as train_sft
from tests.finetune.conftest import (
    TRAINING,
    answer_record,
    pair_record,
    sft_record,
    write_export,
)

pytestmark = TRAINING
PROBLEMS = synthetic.split_problems().train[:32]
QUICK = ["max_steps=4", "per_device_train_batch_size=4", "logging_steps=1", "save_steps=2"]


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export") / "v1"
    return write_export(
        root,
        sft=[sft_record(p) for p in PROBLEMS],
        pairs=[pair_record(p, weight=1.0 + (i % 3)) for i, p in enumerate(PROBLEMS)],
        tasks=[answer_record(p) for p in PROBLEMS[:8]],
    )


def run(
    capsys: pytest.CaptureFixture[str],
    method: str,
    export: Path,
    base: Path,
    out: Path,
    *extra: str,
) -> tuple[int, dict[str, Any] | None, str]:
    code = main([method, "--dataset", str(export), "--base", str(base), "--out", str(out), *extra])
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    outcome = json.loads(lines[-1]) if code in (0, INTERRUPTED_EXIT) and lines else None
    return code, outcome, captured.err


def mlflow_run_of(outcome: dict[str, Any]) -> Any:
    mlflow.set_tracking_uri(f"sqlite:///{os.environ['FLYWHEEL_HOME']}/mlflow.db")
    return MlflowClient().get_run(outcome["mlflow_run_id"])


@pytest.mark.parametrize("method", ["sft", "dpo", "grpo"])
def test_a_recipe_leaves_an_adapter_and_a_complete_mlflow_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, export: Path, plain_base: Path, method: str
) -> None:
    extra = ["num_generations=2", "max_completion_length=4", "canary_fraction=0.2"]
    code, outcome, err = run(
        capsys,
        method,
        export,
        plain_base,
        tmp_path / "job",
        *QUICK,
        *(extra if method == "grpo" else []),
    )

    assert code == 0, err
    assert outcome is not None
    adapter = Path(outcome["adapter_dir"])
    assert (adapter / "adapter_model.safetensors").is_file()
    assert not list(adapter.glob("*.bin"))
    assert is_complete(adapter)
    assert latest_complete(tmp_path / "job" / "checkpoints") is not None
    found = mlflow_run_of(outcome)
    assert found.info.status == "FINISHED"
    tags = found.data.tags
    manifest = json.loads((export / "manifest.json").read_text())
    assert tags["flywheel.dataset_version_id"] == manifest["dataset_version_id"]
    assert tags["flywheel.dataset_manifest_sha256"] == manifest["manifest_sha256"]
    assert tags["flywheel.base_model"] == str(plain_base.resolve())
    assert tags["mlflow.source.git.commit"]
    assert tags["flywheel.status"] == "finished"
    assert found.data.params["method"] == method
    assert found.data.params["lora.r"] == "16"
    history = MlflowClient().get_metric_history(found.info.run_id, "loss")
    assert [m.step for m in history] == [1, 2, 3, 4]
    artifacts = {item.path for item in MlflowClient().list_artifacts(found.info.run_id, "adapter")}
    assert "adapter/adapter_model.safetensors" in artifacts
    if method == "grpo":
        assert tags["flywheel.canaries"] == "2"
        assert MlflowClient().get_metric_history(found.info.run_id, "canary_pass_rate")
        # an untrained model gets every reward 0: every group is zero-signal and filtered
        shares = MlflowClient().get_metric_history(
            found.info.run_id, FILTERED_SHARE.replace("/", "_")
        )
        assert shares
        assert all(m.value == 1.0 for m in shares)
        assert "flywheel.canary_alarm" not in tags  # a tiny model does not hack its verifier


class InterruptAtStep3(StopOnSignal):
    """A SIGTERM that arrives during step 3, delivered to this very process."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        super().on_step_end(args, state, control, **kwargs)


def test_sigterm_checkpoints_and_a_resumed_run_reproduces_the_losses(
    tmp_path: Path, export: Path, plain_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config("sft", None, ["max_steps=6", "per_device_train_batch_size=4",
                                       "logging_steps=1", "save_steps=2"])  # fmt: skip
    whole = train_sft(Job("sft", config, export, plain_base, tmp_path / "whole"))
    with monkeypatch.context() as patch:
        patch.setattr(finetune.job, "StopOnSignal", InterruptAtStep3)
        stopped = train_sft(Job("sft", config, export, plain_base, tmp_path / "split"))
    assert stopped.status == "interrupted"
    assert stopped.global_step == 3
    assert latest_complete(tmp_path / "split" / "checkpoints") == (
        tmp_path / "split" / "checkpoints" / "checkpoint-3"
    )
    resumed = train_sft(Job("sft", config, export, plain_base, tmp_path / "split", is_resume=True))

    assert resumed.status == "finished"
    assert resumed.mlflow_run_id == stopped.mlflow_run_id  # one run, continued
    assert sorted(resumed.losses) == [1, 2, 3, 4, 5, 6]
    for step, loss in whole.losses.items():
        assert resumed.losses[step] == pytest.approx(loss, rel=1e-5), step


def test_a_checkpoint_that_does_not_match_its_manifest_is_passed_over(
    tmp_path: Path, export: Path, plain_base: Path
) -> None:
    config = load_config("sft", None, [*QUICK])
    train_sft(Job("sft", config, export, plain_base, tmp_path / "job"))
    checkpoints = tmp_path / "job" / "checkpoints"
    newest = latest_complete(checkpoints)
    assert newest is not None
    assert newest.name == "checkpoint-4"
    with (newest / "adapter_model.safetensors").open("ab") as file:
        file.write(b"torn")
    assert latest_complete(checkpoints) == checkpoints / "checkpoint-2"
    (checkpoints / "checkpoint-2" / MANIFEST).unlink()
    assert latest_complete(checkpoints) is None


def corrupt(export: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "corrupt"
    copy.mkdir()
    for path in export.rglob("*"):
        if path.is_file() and "cache" not in path.parts:
            target = copy / path.relative_to(export)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    with (copy / "train" / "sft.jsonl").open("ab") as file:
        file.write(b'{"messages": []}\n')
    return copy


def code_task_without_tests(tmp_path: Path) -> Path:
    root = write_export(tmp_path / "no-tests", tasks=[answer_record(PROBLEMS[0])])
    path = root / "train" / "grpo.jsonl"
    row = json.loads(path.read_text())
    row |= {"task_kind": "code", "tests": None, "entry_point": "f"}
    path.write_text(json.dumps(row) + "\n")
    manifest = json.loads((root / "manifest.json").read_text())
    import hashlib

    manifest["export"]["files"]["train/grpo.jsonl"]["sha256"] = hashlib.sha256(
        path.read_bytes()
    ).hexdigest()
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.mark.parametrize(
    ("method", "case", "message"),
    [
        ("sft", "missing export", "does not exist"),
        ("sft", "corrupt export", "does not match the manifest"),
        ("sft", "not a model", "not a model directory"),
        ("sft", "unknown key", "unknown config key 'lora.rank'"),
        ("dpo", "impossible value", "learning_rate"),
        ("grpo", "generations", "must divide the generation batch"),
        ("grpo", "no tests", "a code task without tests"),
        ("dpo", "nothing to train on", "has no train/dpo.jsonl"),
        ("grpo", "vllm", "asks for vllm, which is not installed"),
    ],
)
def test_bad_input_is_one_line_before_any_training(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    export: Path,
    plain_base: Path,
    method: str,
    case: str,
    message: str,
) -> None:
    dataset, base, extra = export, plain_base, list(QUICK)
    if case == "missing export":
        dataset = tmp_path / "nowhere"
    elif case == "corrupt export":
        dataset = corrupt(export, tmp_path)
    elif case == "not a model":
        base = tmp_path
    elif case == "unknown key":
        extra.append("lora.rank=4")
    elif case == "impossible value":
        extra.append("learning_rate=-1")
    elif case == "generations":
        extra.append("num_generations=3")
    elif case == "no tests":
        dataset = code_task_without_tests(tmp_path)
    elif case == "vllm":
        extra.append("use_vllm=true")
    elif case == "nothing to train on":
        dataset = write_export(tmp_path / "sft-only", sft=[sft_record(PROBLEMS[0])])

    code, _, err = run(capsys, method, dataset, base, tmp_path / "job", *extra)

    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "job" / "checkpoints").exists()

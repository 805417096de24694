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

import finetune.grpo
import finetune.job
from finetune import synthetic
from finetune.__main__ import main
from finetune.checkpoint import MANIFEST, StopOnSignal, is_complete, latest_complete
from finetune.config import load_config
from finetune.dynamic_sampling import FILTERED_SHARE
from finetune.job import INTERRUPTED_EXIT, Job
from finetune.sft import train as train_sft
from flywheel.datasets.export_records import TaskRecord
from tests.finetune.conftest import (
    TRAINING,
    answer_record,
    label_record,
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
        labels=[
            label_record(p, is_desirable=i % 2 == 0, weight=1.0 + (i % 3))
            for i, p in enumerate(PROBLEMS)
        ],
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


@pytest.mark.parametrize("method", ["sft", "dpo", "kto", "grpo"])
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


# the bad-input cases that are a config override
BAD_OVERRIDES = {
    "unknown key": ["lora.rank=4"],
    "impossible value": ["learning_rate=-1"],
    "generations": ["num_generations=3"],
    "batch of one": ["per_device_train_batch_size=1"],
    "vllm": ["use_vllm=true"],
}


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
        ("kto", "nothing to train on", "has no train/kto.jsonl"),
        ("kto", "batch of one", "per_device_train_batch_size"),
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
    dataset, base = export, plain_base
    extra = [*QUICK, *BAD_OVERRIDES.get(case, [])]
    if case == "missing export":
        dataset = tmp_path / "nowhere"
    elif case == "corrupt export":
        dataset = corrupt(export, tmp_path)
    elif case == "not a model":
        base = tmp_path
    elif case == "no tests":
        dataset = code_task_without_tests(tmp_path)
    elif case == "nothing to train on":
        dataset = write_export(tmp_path / "sft-only", sft=[sft_record(PROBLEMS[0])])

    code, _, err = run(capsys, method, dataset, base, tmp_path / "job", *extra)

    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "job" / "checkpoints").exists()


GRPO_QUICK = [*QUICK, "num_generations=2", "max_completion_length=4"]


@pytest.mark.usefixtures("no_sandbox")
def test_grpo_on_answer_tasks_trains_without_a_sandbox_on_answer_canaries_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, plain_base: Path
) -> None:
    answers = write_export(tmp_path / "answers", tasks=[answer_record(p) for p in PROBLEMS[:8]])

    # 4 canaries among 8 tasks: a code canary among them would need the missing sandbox
    code, outcome, err = run(
        capsys, "grpo", answers, plain_base, tmp_path / "job", *GRPO_QUICK, "canary_fraction=0.49"
    )

    assert code == 0, err
    assert outcome is not None
    assert mlflow_run_of(outcome).data.tags["flywheel.canaries"] == "4"


def code_record() -> TaskRecord:
    tests = "from solution import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    return TaskRecord(
        prompt="Write `add(a, b)`.",
        entry_point="add",
        hidden_tests=tests,
        visible_tests=None,
        reference_solution="def add(a, b):\n    return a + b\n",
        task_kind="code",
        answer=None,
        difficulty=None,
        group_key="add",
        item_id="add",
    )


@pytest.mark.usefixtures("no_sandbox")
def test_grpo_on_code_tasks_without_a_sandbox_stops_before_the_model_loads(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    plain_base: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tasks = [code_record(), answer_record(PROBLEMS[0])]
    dataset = write_export(tmp_path / "code", tasks=tasks)
    monkeypatch.setattr(finetune.grpo, "load_base", lambda *_: pytest.fail("a model was loaded"))

    code, _, err = run(capsys, "grpo", dataset, plain_base, tmp_path / "job", *GRPO_QUICK)

    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "code tasks need the sandbox" in err
    assert "bwrap is not installed" in err
    assert not (tmp_path / "job" / "checkpoints").exists()

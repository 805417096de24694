"""Training with tools: a GRPO step on tool-call tasks (each prompt shows its own tools), a GRPO
step in an environment (the model's call runs in the episode, the episode's reward is logged
per environment, a tool-call task in the same batch keeps its calls unexecuted), and SFT's
loss on a tool-calling conversation (the assistant's calls and text, not the tool results).

The base is a tiny Qwen 2.5 that memorised one episode (tests/finetune/agent_fixtures.py), so
its rollouts really call the tool; the environment's session is the in-process FakeSession."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import pytest

import finetune.grpo
import finetune.rewards
import finetune.sft
from finetune import environments, synthetic
from finetune.config import load_config
from finetune.environments import row_tools
from finetune.errors import TrainingInputError
from finetune.job import Job, Outcome
from flywheel.datasets.export_records import SftRecord
from tests.finetune.agent_fixtures import (
    CALL,
    PROMPT,
    SPEC,
    TOOLS,
    FakeBackend,
    FakeSession,
    episode_messages,
    save_tool_base,
    task_record,
)
from tests.finetune.conftest import TRAINING, answer_record, write_export

pytestmark = TRAINING
GRPO_STEP = [
    "max_steps=1",
    "per_device_train_batch_size=4",
    "num_generations=2",
    "max_completion_length=96",
    "max_tool_calling_iterations=3",
    "temperature=0.1",
    "canary_fraction=0",
    "lora.r=4",
    "dynamic_sampling=false",
    "logging_steps=1",
]
EXPECTED = [{"name": "cd", "arguments": {"folder": ["docs"]}}]


@pytest.fixture(scope="module")
def tool_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tool_base(tmp_path_factory.mktemp("tool-base"))


def train_keeping_trainer(
    monkeypatch: pytest.MonkeyPatch, module: Any, job: Job
) -> tuple[Outcome, Any]:
    """The recipe's `train`, unchanged, with the trainer it built kept for inspection."""
    kept: list[Any] = []
    run_training = module.run_training

    def keeping(job: Job, export: Any, make_trainer: Any, **kwargs: Any) -> Outcome:
        def make(callbacks: Any) -> Any:
            kept.append(make_trainer(callbacks))
            return kept[-1]

        return run_training(job, export, make, **kwargs)

    monkeypatch.setattr(module, "run_training", keeping)
    return module.train(job), kept[0]


def logged_rows(trainer: Any) -> list[dict[str, Any]]:
    """The step's rollouts as TRL logged them: prompt, completion, each reward."""
    logs = trainer._logs
    rewards = {name: list(values) for name, values in logs["rewards"].items()}
    return [
        {"prompt": prompt, "completion": completion}
        | {name: values[index] for name, values in rewards.items()}
        for index, (prompt, completion) in enumerate(
            zip(logs["prompt"], logs["completion"], strict=True)
        )
    ]


def test_a_grpo_step_on_tool_call_tasks_prompts_each_with_its_tools(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tool_base: Path
) -> None:
    problem = synthetic.split_problems().train[0]
    export = write_export(
        tmp_path / "export",
        tasks=[
            task_record("tool_call", tools=TOOLS, expected_calls=EXPECTED),
            answer_record(problem),
        ],
    )
    config = load_config("grpo", None, GRPO_STEP)

    outcome, trainer = train_keeping_trainer(
        monkeypatch, finetune.grpo, Job("grpo", config, export, tool_base, tmp_path / "job")
    )
    rows = logged_rows(trainer)
    trainer._row_tools = [row_tools(json.dumps(TOOLS))]
    with_tools = trainer._tokenize_prompts([[{"role": "user", "content": PROMPT}]])[0][0]

    assert (outcome.status, outcome.global_step) == ("finished", 1)
    assert "Change the working directory." in trainer.processing_class.decode(with_tools)
    tool_rows = [row for row in rows if row["prompt"][-1]["content"] == PROMPT]
    answer_rows = [row for row in rows if row not in tool_rows]
    assert len(tool_rows) == len(answer_rows) == 2
    assert all(not math.isnan(row["task_reward"]) for row in answer_rows)
    for row in tool_rows:
        assert [message["role"] for message in row["completion"]] == ["assistant"]
        assert row["completion"][0]["tool_calls"][0]["function"] == CALL
        assert row["task_reward"] == 1.0


@pytest.fixture
def fake_sessions(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeSession]]:
    """Episodes over FakeSession instead of the sandbox."""
    FakeSession.opened.clear()
    monkeypatch.setattr(environments, "sandbox_backend", lambda: FakeBackend)
    yield FakeSession.opened
    FakeSession.opened.clear()


def test_a_grpo_step_in_an_environment_runs_the_calls_and_logs_its_reward(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tool_base: Path, fake_sessions: list[Any]
) -> None:
    export = write_export(
        tmp_path / "export",
        tasks=[
            task_record("environment", tools=TOOLS, environment=SPEC),
            task_record("tool_call", tools=TOOLS, expected_calls=EXPECTED),
        ],
    )
    config = load_config("grpo", None, GRPO_STEP)

    outcome, trainer = train_keeping_trainer(
        monkeypatch, finetune.grpo, Job("grpo", config, export, tool_base, tmp_path / "job")
    )
    rows = logged_rows(trainer)
    metrics = mlflow.MlflowClient().get_run(outcome.mlflow_run_id).data.metrics

    assert (outcome.status, outcome.global_step) == ("finished", 1)
    episodes = [row for row in rows if not math.isnan(row["GorillaFileSystem"])]
    calls = [row for row in rows if row not in episodes]
    assert len(episodes) == len(calls) == 2
    assert len(fake_sessions) >= 2
    assert all(session.is_closed for session in fake_sessions)
    assert [session.calls for session in fake_sessions[-2:]] == [[("cd", {"folder": "docs"})]] * 2
    for row in episodes:
        roles = [message["role"] for message in row["completion"]]
        assert roles == ["assistant", "tool", "assistant"]
        assert row["completion"][1]["content"] == "ok: /docs"
        assert row["GorillaFileSystem"] == 1.0
    for row in calls:  # a tool-call task in the same run: its calls are its answer
        assert [message["role"] for message in row["completion"]] == ["assistant"]
    assert metrics["rewards_GorillaFileSystem_mean"] == 1.0  # per environment


def test_an_episode_cut_off_by_its_budget_is_masked_and_rewarded_zero(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tool_base: Path, fake_sessions: list[Any]
) -> None:
    export = write_export(
        tmp_path / "export", tasks=[task_record("environment", tools=TOOLS, environment=SPEC)] * 2
    )
    budget = [*GRPO_STEP, "max_tool_calling_iterations=1", "max_completion_length=40"]
    config = load_config("grpo", None, budget)
    batches: list[dict[str, Any]] = []
    score = finetune.grpo.ToolGrpoTrainer._generate_and_score_completions

    def keeping(self: Any, inputs: Any) -> Any:
        batches.append(score(self, inputs))
        return batches[-1]

    monkeypatch.setattr(finetune.grpo.ToolGrpoTrainer, "_generate_and_score_completions", keeping)
    outcome, trainer = train_keeping_trainer(
        monkeypatch, finetune.grpo, Job("grpo", config, export, tool_base, tmp_path / "job")
    )

    assert outcome.status == "finished"
    assert all(row["GorillaFileSystem"] == 0.0 for row in logged_rows(trainer))
    assert int(batches[0]["completion_mask"].sum()) == 0


def test_a_template_without_tools_is_refused_before_training(
    tmp_path: Path, plain_base: Path
) -> None:
    export = write_export(
        tmp_path / "export", tasks=[task_record("tool_call", tools=TOOLS, expected_calls=EXPECTED)]
    )
    config = load_config("grpo", None, GRPO_STEP)

    with pytest.raises(TrainingInputError, match="does not render tools"):
        finetune.grpo.train(Job("grpo", config, export, plain_base, tmp_path / "job"))


def test_sft_on_a_tool_calling_conversation_trains_the_calls_not_the_results(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tool_base: Path
) -> None:
    user, calling, result, final = episode_messages()
    openai_call = {  # as OpenAI writes it (and the signal store keeps it): arguments as text
        "id": "call_1",
        "type": "function",
        "function": {"name": "cd", "arguments": json.dumps(CALL["arguments"])},
    }
    conversation = [user, {**calling, "tool_calls": [openai_call]}, result]
    record = SftRecord(conversation, final["content"], 1.0, PROMPT, "c1", tools=TOOLS)
    export = write_export(tmp_path / "export", sft=[record])
    config = load_config("sft", None, ["max_steps=1", "per_device_train_batch_size=1", "lora.r=4"])

    outcome, trainer = train_keeping_trainer(
        monkeypatch, finetune.sft, Job("sft", config, export, tool_base, tmp_path / "job")
    )
    row = trainer.train_dataset[0]
    labels = trainer.data_collator([row])["labels"][0].tolist()
    decode = trainer.processing_class.decode
    trained = decode([label for label in labels if label != -100])
    masked = decode([token for token, label in zip(row["input_ids"], labels, strict=True)
                     if label == -100])  # fmt: skip

    assert outcome.status == "finished"
    assert '"name": "cd", "arguments": {"folder": "docs"}' in trained
    assert "Done." in trained
    assert "ok: /docs" in masked  # the tool's result
    assert "ok: /docs" not in trained
    assert "Change the working directory." in masked  # the tools, rendered in the prompt

"""A GRPO step on a two-turn environment task (`max_turns=2`): a real GRPOTrainer step on a
tiny Qwen 2.5 that memorised the two-turn episode ("Go to the docs folder." -> cd docs ->
"Done.", "Back up." -> cd .. -> "Done."), the session the in-process FakeSession. The
episode's reward is the two turns' ground truth (the first turn's alone would score the
episode 0), tool results and the second user turn are masked, and an episode the token budget
cuts in its second turn is masked out of the loss and rewarded 0."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import pytest

import finetune.grpo
from finetune import environments, tiny
from finetune.config import load_config
from finetune.job import Job
from tests.finetune.agent_fixtures import (
    CALL,
    PROMPT,
    SPEC,
    TOOLS,
    FakeBackend,
    FakeSession,
    episode_messages,
    task_record,
)
from tests.finetune.conftest import TRAINING, write_export
from tests.finetune.test_tool_training import GRPO_STEP, logged_rows, train_keeping_trainer

pytestmark = TRAINING
BACK = {"name": "cd", "arguments": {"folder": ".."}}


def two_turn_messages() -> list[dict[str, Any]]:
    result = FakeSession(SPEC)
    first = result.call(CALL["name"], CALL["arguments"]).content
    second = result.call(BACK["name"], BACK["arguments"]).content
    FakeSession.opened.clear()
    assert episode_messages()[2]["content"] == first
    return [
        {"role": "user", "content": PROMPT},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": CALL}],
        },
        {"role": "tool", "name": "cd", "content": first},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": SPEC["turns"][1][0]["content"]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": BACK}],
        },
        {"role": "tool", "name": "cd", "content": second},
        {"role": "assistant", "content": "Done."},
    ]


def save_two_turn_base(directory: Path) -> Path:
    """A tiny Qwen 2.5 that writes `two_turn_messages()`'s assistant turns (also the base of
    bench/grpo_environment.py)."""
    family = tiny.FAMILIES["qwen2_5"]
    probe = tiny.build_family_tokenizer(family, ["x"], vocab_size=300)
    exported = json.loads(json.dumps(TOOLS, sort_keys=True))  # as the export writes them
    text = probe.apply_chat_template(two_turn_messages(), tools=exported, tokenize=False)
    tokenizer = tiny.build_family_tokenizer(family, [text] * 4, vocab_size=1200)
    model = tiny.build_family_model(family, tokenizer, hidden_size=64, max_position_embeddings=1024)
    tiny.pretrain(model, tokenizer, [text], steps=160, batch_size=4, learning_rate=3e-3)
    tiny.save_base(directory, model, tokenizer)
    return directory


@pytest.fixture(scope="module")
def two_turn_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_two_turn_base(tmp_path_factory.mktemp("two-turn-base"))


@pytest.fixture
def fake_sessions(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeSession]]:
    FakeSession.opened.clear()
    monkeypatch.setattr(environments, "sandbox_backend", lambda: FakeBackend)
    yield FakeSession.opened
    FakeSession.opened.clear()


def keep_batches(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    batches: list[dict[str, Any]] = []
    score = finetune.grpo.ToolGrpoTrainer._generate_and_score_completions

    def keeping(self: Any, inputs: Any) -> Any:
        batches.append(score(self, inputs))
        return batches[-1]

    monkeypatch.setattr(finetune.grpo.ToolGrpoTrainer, "_generate_and_score_completions", keeping)
    return batches


def test_a_two_turn_task_trains_and_is_rewarded_by_both_turns_ground_truth(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, two_turn_base: Path, fake_sessions: Any
) -> None:
    export = write_export(
        tmp_path / "export", tasks=[task_record("environment", tools=TOOLS, environment=SPEC)] * 2
    )
    steps = [*GRPO_STEP, "max_turns=2", "max_completion_length=64", "max_episode_tokens=256"]
    config = load_config("grpo", None, steps)
    batches = keep_batches(monkeypatch)

    outcome, trainer = train_keeping_trainer(
        monkeypatch, finetune.grpo, Job("grpo", config, export, two_turn_base, tmp_path / "job")
    )
    rows = logged_rows(trainer)
    metrics = mlflow.MlflowClient().get_run(outcome.mlflow_run_id).data.metrics
    batch = batches[0]
    tokenizer = trainer.processing_class

    assert (outcome.status, outcome.global_step) == ("finished", 1)
    assert [session.calls for session in fake_sessions[-4:]] == [
        [("cd", {"folder": "docs"}), ("cd", {"folder": ".."})]
    ] * 4
    for row in rows:
        roles = [message["role"] for message in row["completion"]]
        assert roles == ["assistant", "tool", "assistant", "user", "assistant", "tool", "assistant"]
        assert row["completion"][3]["content"] == "Back up."
        assert row["GorillaFileSystem"] == 1.0  # cwd /docs/..: the first turn's truth is /docs
    assert metrics["rewards_GorillaFileSystem_mean"] == 1.0
    assert (metrics["episodes_turns_played"], metrics["episodes_cut_off_ratio"]) == (2.0, 0.0)
    for ids, mask, kept in zip(
        batch["completion_ids"], batch["tool_mask"], batch["completion_mask"], strict=True
    ):
        trained = tokenizer.decode(ids[(mask * kept).bool()])
        masked = tokenizer.decode(ids[(mask == 0) & kept.bool()])
        assert "Back up." in masked
        assert "ok: /docs/.." in masked
        assert "Back up." not in trained
        assert "ok:" not in trained
        assert trained.count("Done.") == 2


def test_an_episode_its_token_budget_cuts_in_the_second_turn_is_masked_and_scores_zero(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, two_turn_base: Path, fake_sessions: Any
) -> None:
    export = write_export(
        tmp_path / "export", tasks=[task_record("environment", tools=TOOLS, environment=SPEC)] * 2
    )
    steps = [*GRPO_STEP, "max_turns=2", "max_completion_length=64", "max_episode_tokens=72"]
    config = load_config("grpo", None, steps)
    batches = keep_batches(monkeypatch)

    outcome, trainer = train_keeping_trainer(
        monkeypatch, finetune.grpo, Job("grpo", config, export, two_turn_base, tmp_path / "job")
    )
    rows = logged_rows(trainer)
    metrics = mlflow.MlflowClient().get_run(outcome.mlflow_run_id).data.metrics

    assert outcome.status == "finished"
    assert metrics["episodes_cut_off_ratio"] == 1.0
    assert all(row["GorillaFileSystem"] == 0.0 for row in rows)
    assert all(not math.isnan(row["GorillaFileSystem"]) for row in rows)
    assert all([m["role"] for m in row["completion"]][:3] == ["assistant", "tool", "assistant"]
               for row in rows)  # fmt: skip
    assert int(batches[0]["completion_mask"].sum()) == 0
    assert all("cut off" in str(episode.zero_reason) for episode in trainer.environments)

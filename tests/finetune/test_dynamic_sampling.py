"""Dynamic sampling on hand-built batches: which groups carry no signal, what masking them
leaves of the loss, and the trainer's generate-and-score step around TRL's (faked here)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
import torch
from trl.trainer.grpo_trainer import GRPOTrainer

from finetune.dynamic_sampling import (
    FILTERED_SHARE,
    DynamicSamplingGRPOTrainer,
    mask_rows,
    rows_with_signal,
    zero_signal_groups,
)

pytestmark = pytest.mark.no_database

# Three prompts, two completions each: rewards (1, 1), (1, 0), (0, 0) -> group-centred
# advantages 0, 0 | +0.7, -0.7 | 0, 0; the first group's are float noise, as TRL's can be.
ADVANTAGES = torch.tensor([1e-12, -1e-12, 0.7071, -0.7071, 0.0, 0.0])
COMPLETION_MASK = torch.tensor(
    [[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.int32
)


def hand_built_batch() -> dict[str, Any]:
    return {
        "prompt_ids": torch.arange(12).view(6, 2),
        "prompt_mask": torch.ones(6, 2, dtype=torch.int32),
        "completion_ids": torch.arange(18).view(6, 3),
        "completion_mask": COMPLETION_MASK.clone(),
        "advantages": ADVANTAGES.clone(),
        "num_items_in_batch": COMPLETION_MASK.sum(),
    }


def test_groups_whose_advantages_are_all_zero_carry_no_signal() -> None:
    assert zero_signal_groups(ADVANTAGES, 2).tolist() == [True, False, True]
    assert rows_with_signal(ADVANTAGES, 2).tolist() == [False, False, True, True, False, False]
    assert zero_signal_groups(ADVANTAGES, 3).tolist() == [False, False]  # groups of 3: mixed
    per_token = ADVANTAGES.unsqueeze(1).expand(6, 3)  # a subclass's (B, T) advantages
    assert zero_signal_groups(per_token, 2).tolist() == [True, False, True]


def test_a_batch_that_does_not_split_into_groups_is_an_error() -> None:
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        zero_signal_groups(ADVANTAGES, 4)


def test_masked_rows_leave_the_loss_and_its_token_count() -> None:
    batch = hand_built_batch()

    masked = mask_rows(batch, rows_with_signal(batch["advantages"], 2))

    assert masked["completion_mask"].tolist() == [
        [0, 0, 0], [0, 0, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0], [0, 0, 0]
    ]  # fmt: skip
    assert int(masked["num_items_in_batch"]) == 4  # was 14: only the informative group's tokens
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "advantages"):
        assert torch.equal(masked[key], batch[key])  # nothing else changes, no row is dropped
    assert torch.equal(batch["completion_mask"], COMPLETION_MASK)  # the input is not modified
    # A token-normalised ('dapo') loss, sum(loss * mask) / num_items: with the zero-signal
    # groups masked it is the informative tokens' mean, not diluted by the other ten tokens.
    per_token_loss = -ADVANTAGES.unsqueeze(1).expand(6, 3)
    loss = (per_token_loss * masked["completion_mask"]).sum() / masked["num_items_in_batch"]
    assert float(loss) == pytest.approx((-0.7071 * 3 + 0.7071) / 4)


def test_a_tool_mask_is_masked_alike_and_counted() -> None:
    batch = hand_built_batch() | {"tool_mask": torch.tensor([[1, 1, 1]] * 2 + [[1, 0, 1]] * 4)}

    masked = mask_rows(batch, rows_with_signal(batch["advantages"], 2))

    assert masked["tool_mask"][:, 0].tolist() == [0, 0, 1, 1, 0, 0]
    assert int(masked["num_items_in_batch"]) == 3  # row 2: tokens 0 and 2; row 3: token 0


class FakeAccelerator:
    """One process: gathering returns the tensor itself (what accelerate does on one)."""

    process_index = 0
    device = torch.device("cpu")

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


class FakeModel:
    training = True


def trainer_around(monkeypatch: pytest.MonkeyPatch, batch: dict[str, Any]) -> Any:
    """The subclass with TRL's generate-and-score step replaced by one returning `batch`."""
    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", lambda self, _: batch)
    trainer: Any = object.__new__(DynamicSamplingGRPOTrainer)
    trainer.model = FakeModel()
    trainer.accelerator = FakeAccelerator()
    trainer.num_generations = 2
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    return trainer


def test_the_trainer_masks_zero_signal_groups_and_logs_their_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trainer = trainer_around(monkeypatch, hand_built_batch())

    out = trainer._generate_and_score_completions([{}] * 6)

    assert out["completion_mask"][:, 0].tolist() == [0, 0, 1, 1, 0, 0]
    assert int(out["num_items_in_batch"]) == 4
    assert trainer._metrics["train"][FILTERED_SHARE] == [pytest.approx(2 / 3)]


def test_evaluation_batches_are_left_as_trl_scores_them(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = hand_built_batch()
    trainer = trainer_around(monkeypatch, batch)
    trainer.model.training = False

    out = trainer._generate_and_score_completions([{}] * 6)

    assert out is batch
    assert FILTERED_SHARE not in trainer._metrics["train"]

"""Learning signal, proved on CPU, through our recipes (`finetune.sft`, `finetune.dpo`,
`finetune.grpo`) on exports written by the real exporter.

The story in miniature: a tiny Llama is pretrained (full parameters) on the broad slice of
two-digit addition — the sums without a carry — so it knows the format but not the carry
(held-out exact match ~0). LoRA post-training then adds the depth:

- SFT lifts held-out exact match far above the base's; with the adapter disabled it falls back;
- DPO (the reference is the same model with the adapter off) makes held-out preference
  accuracy clearly better than chance; with the adapter off every margin is exactly 0;
- GRPO on the SFT model (its adapter merged, a fresh adapter trained), on the train carries and
  every second broad sum, lifts the held-out GREEDY exact match over the SFT model's (the
  metric the gate scores) and the sampled reward with it, without forgetting the broad sums;
  with its adapter off the model is back to the SFT model's reward.

Each check fails if the LoRA weights are not applied. Settings, thresholds and the steps
themselves live in `tests/finetune/learning_chain.py`; `bench/calibrate_learning.py` runs that
same chain over the table's seeds and prints every number and each threshold's margin. Each
threshold sits below the worst calibrated seed. A run uses one seed: FLYWHEEL_LEARNING_SEED,
else the current commit's hash mod the table's seeds, else 0 (printed at the start).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.finetune import learning_chain as chain
from tests.finetune.conftest import TRAINING

pytestmark = TRAINING

SEED, SEED_NOTE = chain.chosen_seed()
LIMITS = chain.THRESHOLDS


@pytest.fixture(scope="module", autouse=True)
def one_thread(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """As calibrated: one thread (faster at this size, and the numbers are the calibrated
    ones); MLflow in a store of this module's own (module fixtures run before the per-test
    store is set up)."""
    print(f"learning tests: seed {SEED}, {SEED_NOTE}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLYWHEEL_HOME", str(tmp_path_factory.mktemp("learning-home")))
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pretrained tiny base (about 10 s; once per test session)."""
    return chain.build_base(tmp_path_factory.mktemp("pretrained-base"), SEED)


@pytest.fixture(scope="module")
def sft_adapter(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chain.train_sft(base, tmp_path_factory.mktemp("sft"), SEED)


def test_sft_lifts_held_out_exact_match_and_only_with_the_adapter(
    base: Path, sft_adapter: Path
) -> None:
    found = chain.measure_sft(base, sft_adapter)

    print(f"seed {SEED} held-out exact match: base {found['base_em']:.3f}, SFT "
          f"{found['sft_em']:.3f}, disabled {found['sft_disabled_em']:.3f}")  # fmt: skip
    assert found["base_em"] < LIMITS.base_em_max
    assert found["sft_em"] >= LIMITS.sft_em_min
    assert found["sft_disabled_em"] == pytest.approx(
        found["base_em"], abs=LIMITS.disabled_em_tolerance
    )


def test_dpo_makes_held_out_preferences_clearly_better_than_chance(
    base: Path, tmp_path: Path
) -> None:
    found = chain.run_dpo(base, tmp_path, SEED)

    print(f"seed {SEED} held-out preference accuracy: DPO {found['dpo_accuracy']:.3f}, "
          f"adapter disabled {found['dpo_disabled_accuracy']:.3f}")  # fmt: skip
    assert found["dpo_accuracy"] >= LIMITS.dpo_accuracy_min
    assert found["dpo_disabled_accuracy"] == 0.0  # policy == reference: every margin exactly 0


def test_grpo_after_sft_lifts_the_held_out_greedy_exact_match(
    base: Path, sft_adapter: Path, tmp_path: Path
) -> None:
    found = chain.run_grpo(base, sft_adapter, tmp_path, SEED)

    print(f"seed {SEED} held-out greedy exact match: SFT {found['sft_greedy_em']:.3f}, GRPO "
          f"{found['grpo_greedy_em']:.3f}; sampled reward: SFT {found['sft_reward']:.3f}, "
          f"GRPO {found['grpo_reward']:.3f}, disabled {found['grpo_disabled_reward']:.3f}; "
          f"groups filtered {found['filtered_share']:.3f}; broad exact match: SFT "
          f"{found['sft_broad_em']:.3f}, GRPO {found['grpo_broad_em']:.3f}")  # fmt: skip
    assert found["grpo_greedy_em"] >= found["sft_greedy_em"] + LIMITS.grpo_em_lift_min
    assert found["grpo_reward"] >= found["sft_reward"] + LIMITS.grpo_reward_lift_min
    assert found["grpo_disabled_reward"] == pytest.approx(
        found["sft_reward"], abs=LIMITS.disabled_reward_tolerance
    )
    # on a task mix of carries and broad sums it learns the carry without forgetting the rest
    assert found["grpo_broad_em"] >= found["sft_broad_em"] - LIMITS.grpo_broad_em_fall_max

"""Which seed the learning tests run: FLYWHEEL_LEARNING_SEED, else the commit, else 0."""

from __future__ import annotations

import pytest

from tests.finetune import learning_seed

pytestmark = pytest.mark.no_database


def test_the_variable_chooses_the_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(learning_seed.SEED_VARIABLE, "3")
    assert learning_seed.chosen_seed() == (3, f"from {learning_seed.SEED_VARIABLE}=3")
    monkeypatch.setenv(learning_seed.SEED_VARIABLE, "7")
    seed, note = learning_seed.chosen_seed()
    assert seed == 7
    assert "not one of the calibrated seeds" in note


def test_a_variable_that_is_not_a_number_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(learning_seed.SEED_VARIABLE, "zero")
    with pytest.raises(ValueError, match="must be an integer, not 'zero'"):
        learning_seed.chosen_seed()


def test_without_the_variable_the_commit_chooses_among_the_tables_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(learning_seed.SEED_VARIABLE, raising=False)
    monkeypatch.setattr(
        learning_seed, "_git_head", lambda: "00000000000000000000000000000000000000c8"
    )
    seed, note = learning_seed.chosen_seed()
    assert (
        seed == learning_seed.SEEDS[0xC8 % len(learning_seed.SEEDS)]
    )  # 200 mod 5 -> the first seed
    assert "from commit 000000000000" in note
    monkeypatch.setattr(learning_seed, "_git_head", lambda: "ff" * 20)
    assert (
        learning_seed.chosen_seed()[0]
        == learning_seed.SEEDS[int("ff" * 20, 16) % len(learning_seed.SEEDS)]
    )


def test_the_real_checkout_gives_one_of_the_tables_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(learning_seed.SEED_VARIABLE, raising=False)
    assert learning_seed.chosen_seed()[0] in learning_seed.SEEDS


def test_without_git_it_is_seed_0_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(learning_seed.SEED_VARIABLE, raising=False)
    monkeypatch.setenv("PATH", "/nowhere")  # no git to run

    seed, note = learning_seed.chosen_seed()

    assert seed == 0
    assert "git unavailable" in note

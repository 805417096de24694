"""`python -m finetune.tiny` reports each pretraining step (its progress bar draws from it)."""

from __future__ import annotations

import pytest

from finetune import synthetic, tiny

pytestmark = pytest.mark.no_database


def test_pretraining_hands_every_step_loss_to_its_progress() -> None:
    tokenizer = tiny.build_tokenizer(synthetic.tokenizer_texts(), vocab_size=128)
    model = tiny.build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2)
    seen: list[float] = []

    losses = tiny.pretrain(
        model, tokenizer, ["1+2=3", "4+4=8"], steps=3, batch_size=2, on_step=seen.append
    )

    assert len(losses) == 3
    assert seen == losses

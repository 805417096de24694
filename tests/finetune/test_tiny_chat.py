"""`python -m finetune.tiny_chat`: a tiny chat base pretrained until it knows its conversations,
first without their tools' system text, then with it."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from finetune import tiny_chat
from flywheel.demo import orders

pytestmark = pytest.mark.no_database


def lookups() -> list[dict[str, object]]:
    requests = [orders.Request("lookup", item, phrasing) for item in ("lamp", "rug")
                for phrasing in (0, 1)]  # fmt: skip
    return [{"messages": orders.conversation(r), "tools": orders.TOOLS} for r in requests]


def test_each_phase_trains_until_its_conversations_are_known(tmp_path: Path) -> None:
    reports: list[tuple[str, int]] = []

    losses = tiny_chat.build_chat_base(
        tmp_path, lookups(), steps=tiny_chat.CHECK_EVERY, seed=0,
        report=lambda phase, done, loss: reports.append((phase, done)),
    )  # fmt: skip

    phases = [phase for phase, _ in reports]
    assert phases == sorted(phases, key=["short", "whole"].index)  # short first, then whole
    short = max(done for phase, done in reports if phase == "short")
    whole = max(done for phase, done in reports if phase == "whole")
    assert len(losses) == short + whole
    assert whole < tiny_chat.MAX_WHOLE_STEPS  # it stopped because it knew them
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    examples = [tiny_chat._encoded(tokenizer, row) for row in lookups()]
    assert tiny_chat._is_known(model, examples, tokenizer.pad_token_id)
    # a model that has not trained knows nothing
    family = tiny_chat.tiny.FAMILIES["qwen2_5"]
    untrained = tiny_chat.tiny.build_family_model(
        family, tokenizer, hidden_size=tiny_chat.HIDDEN_SIZE, num_heads=4,
        max_position_embeddings=1024,
    )  # fmt: skip
    assert not tiny_chat._is_known(untrained, examples, tokenizer.pad_token_id)

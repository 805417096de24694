"""The demo's arithmetic feedback and the tiny base model it trains on agree on every problem:
`finetune.synthetic` uses the demo's own definition of the domain (not a copy), the base is
pretrained on exactly the problems the demo's feedback treats as already known, and every
right and wrong answer the feedback shows is the trainer's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from finetune import synthetic, tiny
from flywheel.demo import arithmetic, arithmetic_feedback
from flywheel.demo.data import write_arithmetic
from ingest.jsonl import read_objects

pytestmark = pytest.mark.no_database


def test_finetune_uses_the_demo_domain_not_a_copy() -> None:
    assert synthetic.Problem is arithmetic.Problem
    assert synthetic.Split is arithmetic.Split
    assert synthetic.split_problems is arithmetic.split_problems
    assert (synthetic.LOW, synthetic.HIGH) == (arithmetic.LOW, arithmetic.HIGH)


def answers(event: dict[str, Any]) -> tuple[str, str, str]:
    """(prompt, right answer, wrong answer) of a feedback event; a thumbs up has no wrong one."""
    value = event["value"]
    if event["kind"] == "comparison":
        right = value["responses"][value["preferred"]]
        [wrong] = [text for text in value["responses"] if text != right]
        return value["messages"][-1]["content"], right, wrong
    if event["kind"] == "correction":
        return event["prompt"], value["text"], event["response"]
    return event["prompt"], event["response"], ""


@pytest.mark.parametrize("quick", [False, True])
def test_the_demo_feedback_teaches_what_the_base_was_not_pretrained_on(
    tmp_path: Path, quick: bool
) -> None:
    # The corpus `python -m finetune.tiny` pretrains the demo's base on (no --text-file).
    tokenizer = tiny.build_tokenizer(synthetic.tokenizer_texts())
    pretrained = set(synthetic.pretraining_texts(tokenizer))
    split = synthetic.split_problems()
    by_prompt = {problem.prompt: problem for problem in split.train + split.held_out}

    for batch in (1, 2):
        carries, plain = arithmetic_feedback.batch_problems(batch, quick=quick)
        [path] = write_arithmetic(tmp_path, batch=batch, quick=quick)
        events = [event for _, event in read_objects(path)]

        assert {answers(event)[0] for event in events} == {p.prompt for p in carries + plain}
        for event in events:
            prompt, right, wrong = answers(event)
            problem = by_prompt[prompt]
            assert right == problem.answer
            assert wrong in ("", problem.wrong_answer)
        rendered = {
            p.prompt: tokenizer.apply_chat_template(
                synthetic.sft_example(by_prompt[p.prompt])["messages"], tokenize=False
            )
            for p in carries + plain
        }
        assert all(rendered[p.prompt] in pretrained for p in plain)
        assert not any(rendered[p.prompt] in pretrained for p in carries)
        assert set(plain) <= set(split.broad)
        assert not set(carries) & set(split.broad)

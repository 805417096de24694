"""Real families' chat templates through the recipes: a tiny random base of each family (its
architecture, control tokens and the chat template it ships) trains one step of SFT, DPO and
GRPO, and SFT's loss covers exactly the assistant's tokens, end-of-turn token included."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

import finetune.sft
from finetune import dpo, grpo, synthetic, tiny
from finetune.__main__ import main
from finetune.config import load_config
from finetune.errors import TrainingInputError
from finetune.job import Job, Outcome
from finetune.templates import TRAINING_TEMPLATES, use_training_template
from flywheel.datasets.export_records import SftRecord
from tests.finetune.conftest import TRAINING, answer_record, pair_record, write_export

pytestmark = TRAINING
PROBLEMS = synthetic.split_problems().train[:4]
ONE_STEP = ["max_steps=1", "per_device_train_batch_size=2", "max_length=256", "lora.r=4"]

# What each family's training template puts in the loss mask for one assistant turn (its
# content is {}), and what it adds after the conversation's last turn.
MASKED_TURN = {
    "llama3": "{}<|eot_id|>",
    "llama3_1": "{}<|eot_id|>",
    "llama3_2": "{}<|eot_id|>",
    # TRL's variant opens the block before the newline that ends the generation prompt.
    "qwen2_5": "\n{}<|im_end|>\n",
    # TRL's variant always writes the (empty) think block, the model learns to write it.
    "qwen3": "<think>\n\n</think>\n\n{}<|im_end|>\n",
    "mistral": "{}</s>",
    "phi3": "{}<|end|>\n",
    "gemma": "{}<end_of_turn>\n",
}
MASKED_AFTER_LAST = {"phi3": "<|endoftext|>"}


def two_turns(first: synthetic.Problem, second: synthetic.Problem) -> SftRecord:
    """A conversation with an earlier assistant turn: both turns are the assistant's."""
    messages = [*synthetic.user(first), *synthetic.assistant(first.answer), *synthetic.user(second)]
    return SftRecord(messages, second.answer, 1.0, second.prompt, f"{first.prompt}{second.prompt}")


@pytest.fixture(scope="module", autouse=True)
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One embedded MLflow store for the module (conftest's gives each test its own): a fresh
    store's migrations cost seconds, more than a step of training here, and nothing in this
    module reads its runs."""
    import mlflow

    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLYWHEEL_HOME", str(home))
        patch.delenv("FLYWHEEL_MLFLOW_TRACKING_URI", raising=False)
        yield f"sqlite:///{home / 'mlflow.db'}"
    if mlflow.active_run() is not None:
        mlflow.end_run()


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_export(
        tmp_path_factory.mktemp("export") / "v1",
        sft=[two_turns(PROBLEMS[i], PROBLEMS[i + 1]) for i in range(3)],
        pairs=[pair_record(p) for p in PROBLEMS],
        tasks=[answer_record(p) for p in PROBLEMS],
    )


@pytest.fixture(scope="module", params=sorted(tiny.FAMILIES))
def family_base(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp(request.param, numbered=False)
    tiny.save_family_base(directory, request.param)
    return directory


def spans(labels: list[int]) -> list[list[int]]:
    """The runs of trained (not -100) labels, in order."""
    runs: list[list[int]] = []
    previous = -100
    for label in labels:
        if label != -100:
            if previous == -100:
                runs.append([])
            runs[-1].append(label)
        previous = label
    return runs


def train_sft_keeping_trainer(monkeypatch: pytest.MonkeyPatch, job: Job) -> tuple[Outcome, Any]:
    """`finetune.sft.train`, unchanged, with the trainer it built kept for inspection."""
    kept: list[Any] = []
    run_training = finetune.sft.run_training

    def keeping(job: Job, export: Any, make_trainer: Any, **kwargs: Any) -> Outcome:
        def make(callbacks: Any) -> Any:
            kept.append(make_trainer(callbacks))
            return kept[-1]

        return run_training(job, export, make, **kwargs)

    monkeypatch.setattr(finetune.sft, "run_training", keeping)
    return finetune.sft.train(job), kept[0]


def test_sft_trains_exactly_the_assistant_tokens(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, export: Path, family_base: Path
) -> None:
    name = family_base.name
    config = load_config("sft", None, ONE_STEP)
    outcome, trainer = train_sft_keeping_trainer(
        monkeypatch, Job("sft", config, export, family_base, tmp_path / "job")
    )

    assert outcome.status == "finished"
    assert outcome.global_step == 1
    conversations = [
        json.loads(line)["messages"]
        for line in (export / "train" / "sft.jsonl").read_text().splitlines()
    ]  # the file TRL read, in its order
    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    batch = trainer.data_collator(rows)  # the labels the loss sees
    assert len(rows) == len(conversations)
    for messages, row, labels in zip(conversations, rows, batch["labels"].tolist(), strict=True):
        trained = [trainer.processing_class.decode(span) for span in spans(labels)]
        expected = [
            MASKED_TURN[name].format(message["content"])
            for message in messages
            if message["role"] == "assistant"
        ]
        expected[-1] += MASKED_AFTER_LAST.get(name, "")
        assert len(expected) == 2
        assert trained == expected, trainer.processing_class.decode(row["input_ids"])


def test_dpo_and_grpo_train_one_step(tmp_path: Path, export: Path, family_base: Path) -> None:
    dpo_config = load_config("dpo", None, ONE_STEP)
    grpo_config = load_config(
        "grpo",
        None,
        [*ONE_STEP, "num_generations=2", "max_completion_length=4", "canary_fraction=0.2"],
    )

    preferred = dpo.train(Job("dpo", dpo_config, export, family_base, tmp_path / "dpo"))
    rewarded = grpo.train(Job("grpo", grpo_config, export, family_base, tmp_path / "grpo"))

    assert (preferred.status, preferred.global_step) == ("finished", 1)
    assert (rewarded.status, rewarded.global_step) == ("finished", 1)
    assert rewarded.adapter_dir is not None
    assert (rewarded.adapter_dir / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("name", ["llama3_1", "llama3_2", "mistral"])
def test_a_flywheel_training_template_renders_as_its_original(name: str) -> None:
    original = tiny.FAMILIES[name].chat_template
    tokenizer = tiny.build_family_tokenizer(tiny.FAMILIES["llama3_1"], ["1+2=3"])
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": "1"}}}
    conversations = [
        [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": " 3 "}],
        [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"},
         {"role": "user", "content": "2+2="}],
        [{"role": "user", "content": "1+2="},
         {"role": "assistant", "content": "", "tool_calls": [call]},
         {"role": "tool", "content": "3"}, {"role": "assistant", "content": "3"}],
    ]  # fmt: skip
    for messages in conversations[:2] if name == "mistral" else conversations:
        for extra in ({}, {"add_generation_prompt": True}, {"builtin_tools": ["add"]}):

            def render(template: str, messages: list[Any] = messages, extra: Any = extra) -> str:
                return str(tokenizer.apply_chat_template(
                    messages, tokenize=False, chat_template=template, **extra
                ))  # fmt: skip

            assert render(TRAINING_TEMPLATES[original]) == render(original)


def test_a_template_without_markers_stops_sft_at_start_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, export: Path
) -> None:
    family = tiny.FAMILIES["qwen2_5"]
    tokenizer = tiny.build_family_tokenizer(family, synthetic.tokenizer_texts())
    tokenizer.chat_template = (  # ChatML, as many fine-tunes ship it: no markers
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    base = tmp_path / "chatml-base"
    tiny.save_base(base, tiny.build_family_model(family, tokenizer), tokenizer)
    out = tmp_path / "job"

    code = main(["sft", "--dataset", str(export), "--base", str(base), "--out", str(out)])

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert "no {% generation %} markers" in err[-1]
    assert "assistant_only_loss=false" in err[-1]
    assert not (out / "checkpoints").exists()
    with pytest.raises(TrainingInputError, match=r"no \{% generation %\} markers"):
        use_training_template(AutoTokenizer.from_pretrained(base), base)

"""Dataset exports: the files load with `datasets`, TRL's data utilities and trainers take them,
hidden tests stay out of prompts, memory stays flat, and a failed export leaves nothing behind."""

from __future__ import annotations

import hashlib
import json
import math
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset, load_dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from trl.data_utils import is_conversational, maybe_apply_chat_template

from flywheel.datasets.export import MANIFEST_NAME, ExportSummary, export_version
from flywheel.datasets.export_formats import LAYOUTS
from flywheel.datasets.export_records import (
    ItemStreams,
    LabelRecord,
    PairRecord,
    SftRecord,
    TaskRecord,
)
from flywheel.errors import Conflict, InvalidInput

PROMPT = [
    {"role": "system", "content": "you are the billing assistant"},
    {"role": "user", "content": "why was i charged twice"},
]
HIDDEN = "assert add(2, 3) == 5\nassert add(-1, 1) == 0"
VISIBLE = "assert add(1, 1) == 2"
MANIFEST = {"dataset_version_id": "dv-1", "domain": "acme/billing", "version": 3}


def sft(item_id: str = "s1", **overrides: Any) -> SftRecord:
    fields: dict[str, Any] = {
        "messages": PROMPT,
        "completion": "a hold, released in five days",
        "weight": 1.0,
    }
    return SftRecord(**(fields | overrides), group_key="thread-1", item_id=item_id)


def pair(item_id: str = "p1", **overrides: Any) -> PairRecord:
    fields: dict[str, Any] = {
        "messages": PROMPT,
        "chosen": "a hold, released in five days",
        "rejected": "no idea",
        "weight": 0.5,
        "why": "correction",
    }
    return PairRecord(**(fields | overrides), group_key="thread-1", item_id=item_id)


def label(item_id: str = "l1", is_desirable: bool = True) -> LabelRecord:
    return LabelRecord(PROMPT, "a hold", is_desirable, 2.0, "thread-2", item_id, why="thumbs")


def task(item_id: str = "t1", **overrides: Any) -> TaskRecord:
    fields: dict[str, Any] = {
        "prompt": "Write add(a, b) returning the sum.\n>>> add(1, 1)\n2",
        "entry_point": "add",
        "hidden_tests": HIDDEN,
        "visible_tests": VISIBLE,
        "reference_solution": "def add(a, b):\n    return a + b\n",
        "task_kind": "code",
        "answer": None,
        "difficulty": 0.25,
        "weight": 1.5,
    }
    return TaskRecord(**(fields | overrides), group_key="repo-1", item_id=item_id)


def streams(tag: str) -> ItemStreams:
    return ItemStreams(
        sft=[sft(f"{tag}-s1"), sft(f"{tag}-s2", completion="refunded")],
        pairs=[pair(f"{tag}-p1")],
        labels=[label(f"{tag}-l1"), label(f"{tag}-l2", is_desirable=False)],
        tasks=[task(f"{tag}-t1"), task(f"{tag}-t2", reference_solution=None)],
    )


def export(tmp_path: Path, fmt: Any, **splits: ItemStreams) -> ExportSummary:
    splits = splits or {"train": streams("tr"), "eval": streams("ev")}
    return export_version(tmp_path / "export", fmt, splits, MANIFEST)


def load(tmp_path: Path, relative: str) -> Dataset:
    path = tmp_path / "export" / relative
    return load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "c"))


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer with a chat template, built here: no hub, no download."""
    words = " ".join(str(message["content"]) for message in PROMPT).split()
    specials = ["[UNK]", "[PAD]", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
    vocab = {token: index for index, token in enumerate(dict.fromkeys(specials + words))}
    model = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=model, unk_token="[UNK]", pad_token="[PAD]", eos_token="</s>"
    )
    wrapped.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}"
    )
    return wrapped


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


# --- trl -----------------------------------------------------------------------------------

TRL_COLUMNS = {
    "sft.jsonl": {"messages", "weight"},
    "dpo.jsonl": {"prompt", "chosen", "rejected", "weight"},
    "kto.jsonl": {"prompt", "completion", "label", "weight"},
    "grpo.jsonl": {
        "prompt",
        "task_id",
        "task_kind",
        "entry_point",
        "tests",
        "answer",
        "tools",
        "expected_calls",
        "environment",
        "difficulty",
        "weight",
    },
}


@pytest.mark.parametrize(
    ("name", "rows", "user_turn"),
    [
        ("sft.jsonl", 2, "<|user|> why was i charged twice </s> "),
        ("dpo.jsonl", 1, "<|user|> why was i charged twice </s> "),
        ("kto.jsonl", 2, "<|user|> why was i charged twice </s> "),
        ("grpo.jsonl", 2, "<|user|> Write add(a, b) returning the sum."),
    ],
)
def test_trl_files_load_as_conversational_datasets(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, name: str, rows: int, user_turn: str
) -> None:
    export(tmp_path, "trl")
    for split in ("train", "eval"):
        dataset = load(tmp_path, f"{split}/{name}")
        assert set(dataset.column_names) == TRL_COLUMNS[name]
        assert dataset.num_rows == rows
        for row in dataset:
            assert is_conversational(row)
            rendered = maybe_apply_chat_template(row, tokenizer)
            assert user_turn in (rendered.get("prompt") or rendered["text"])


def test_trl_rows_hold_the_records(tmp_path: Path) -> None:
    export(tmp_path, "trl")
    sft_row, dpo_row = load(tmp_path, "train/sft.jsonl")[0], load(tmp_path, "train/dpo.jsonl")[0]
    assert sft_row["messages"] == [*PROMPT, {"role": "assistant", "content": sft().completion}]
    assert dpo_row["prompt"] == PROMPT
    assert dpo_row["chosen"] == [{"role": "assistant", "content": pair().chosen}]
    assert dpo_row["rejected"] == [{"role": "assistant", "content": "no idea"}]
    assert dpo_row["weight"] == 0.5
    kto = load(tmp_path, "train/kto.jsonl")
    assert kto["label"] == [True, False]
    assert kto["weight"] == [2.0, 2.0]
    grpo = load(tmp_path, "train/grpo.jsonl")[0]
    assert grpo["prompt"] == [{"role": "user", "content": task().prompt}]
    assert grpo["tests"] == f"{VISIBLE}\n\n{HIDDEN}"  # as flywheel.signals.verification joins them
    assert (grpo["task_id"], grpo["entry_point"], grpo["difficulty"]) == ("tr-t1", "add", 0.25)
    assert grpo["weight"] == 1.5  # GRPO draws prompts by it


def test_chat_template_splits_prompt_from_completion(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    export(tmp_path, "trl")
    rendered = maybe_apply_chat_template(load(tmp_path, "train/dpo.jsonl")[0], tokenizer)
    assert rendered["prompt"].endswith("<|assistant|> ")
    assert rendered["chosen"] == "a hold, released in five days </s> "
    assert rendered["rejected"] == "no idea </s> "


# --- openai and jsonl ----------------------------------------------------------------------


def test_openai_files_follow_the_fine_tuning_formats(tmp_path: Path) -> None:
    summary = export(tmp_path, "openai")
    chat = lines(tmp_path / "export/train/chat.jsonl")
    assert [set(row) for row in chat] == [{"messages"}] * 3  # 2 sft + the task with a reference
    assert chat[0]["messages"] == [*PROMPT, {"role": "assistant", "content": sft().completion}]
    assert chat[2]["messages"] == [
        {"role": "user", "content": task().prompt},
        {"role": "assistant", "content": task().reference_solution},
    ]
    (preference,) = lines(tmp_path / "export/train/preference.jsonl")
    assert preference == {
        "input": {"messages": PROMPT},
        "preferred_output": [{"role": "assistant", "content": pair().chosen}],
        "non_preferred_output": [{"role": "assistant", "content": "no idea"}],
    }
    assert load(tmp_path, "eval/preference.jsonl").num_rows == 1
    assert summary.skipped == {"tasks": 2}  # one task without a reference per split
    assert summary.omitted_kinds == ("labels",)  # OpenAI has no unpaired-preference format
    assert sorted(f.path for f in summary.files) == [
        "eval/chat.jsonl", "eval/preference.jsonl", "train/chat.jsonl", "train/preference.jsonl",
    ]  # fmt: skip


def test_openai_refuses_tool_turns_it_cannot_express(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "look it up"}, {"role": "tool", "content": "42"}]
    with pytest.raises(InvalidInput, match="item s9: OpenAI needs a tool_call_id on tool turns"):
        export(tmp_path, "openai", train=ItemStreams(sft=[sft("s9", messages=messages)]))


def test_jsonl_format_keeps_every_field(tmp_path: Path) -> None:
    export(tmp_path, "jsonl")
    (row,) = [r for r in lines(tmp_path / "export/train/tasks.jsonl") if r["item_id"] == "tr-t1"]
    assert row["hidden_tests"] == HIDDEN
    assert row["visible_tests"] == VISIBLE
    assert row["reference_solution"] == task().reference_solution
    assert row["weight"] == 1.5
    assert lines(tmp_path / "export/train/pairs.jsonl")[0] | {"item_id": "p1"} == {
        "item_id": "p1", "group_key": "thread-1", "messages": PROMPT,
        "chosen": pair().chosen, "rejected": "no idea", "weight": 0.5, "why": "correction",
    }  # fmt: skip
    labels = load(tmp_path, "eval/labels.jsonl")
    assert labels["is_desirable"] == [True, False]
    assert labels["why"] == ["thumbs", "thumbs"]


# --- hidden tests --------------------------------------------------------------------------

PROMPT_COLUMNS = {
    "trl": ("messages", "prompt"),
    "openai": ("messages", "input"),
    "jsonl": ("messages", "prompt"),
}


@pytest.mark.parametrize("fmt", ["trl", "openai", "jsonl"])
def test_hidden_tests_never_reach_a_prompt(tmp_path: Path, fmt: str) -> None:
    summary = export(tmp_path, fmt)
    hidden_lines = HIDDEN.splitlines()
    for exported in summary.files:
        for row in lines(tmp_path / "export" / exported.path):
            for column in PROMPT_COLUMNS[fmt]:
                text = json.dumps(row.get(column, ""))
                assert not any(line in text for line in hidden_lines), (exported.path, row)


@pytest.mark.parametrize(
    "prompt",
    [
        f"Write add.\n{HIDDEN}",  # the whole hidden test file
        "Write add(a, b). It must pass:\n    assert add(-1, 1) == 0\n",  # one hidden assert
    ],
)
@pytest.mark.parametrize("fmt", ["trl", "openai", "jsonl"])
def test_a_task_leaking_hidden_tests_is_refused(tmp_path: Path, fmt: str, prompt: str) -> None:
    leaky = ItemStreams(tasks=[task("t1"), task("leaky-7", prompt=prompt)])
    with pytest.raises(InvalidInput, match="item leaky-7: the prompt contains its hidden tests"):
        export(tmp_path, fmt, train=leaky)
    assert not (tmp_path / "export").exists()


def test_a_hidden_assert_that_is_also_visible_may_be_shown(tmp_path: Path) -> None:
    shown = task(prompt=f"Write add.\n{VISIBLE}", hidden_tests=f"{VISIBLE}\nassert add(2, 2) == 4")
    summary = export(tmp_path, "trl", train=ItemStreams(tasks=[shown]))
    assert summary.rows == 1


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"hidden_tests": None, "visible_tests": None}, "a code task needs tests"),
        ({"entry_point": None}, "a code task needs tests and an entry point"),
        ({"task_kind": "answer", "answer": " "}, "an answer task needs its answer"),
        ({"task_kind": "essay"}, "task_kind 'essay'"),
        ({"difficulty": math.nan}, "difficulty must be a pass rate"),
    ],
)
def test_grpo_refuses_tasks_it_cannot_reward(
    tmp_path: Path, overrides: dict[str, Any], problem: str
) -> None:
    with pytest.raises(InvalidInput, match=f"item t1: {problem}"):
        export(tmp_path, "trl", train=ItemStreams(tasks=[task(**overrides)]))


# --- record checks -------------------------------------------------------------------------

USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        (sft(messages=[]), "messages must be a non-empty list"),
        (sft(messages="hi"), "messages must be a non-empty list"),
        (sft(messages=[{"role": "bot", "content": "hi"}]), "message 0 has role 'bot'"),
        (sft(messages=[USER, {"role": "user", "content": " "}]), "message 1 content must be"),
        (sft(messages=[USER | {"extra": "x"}]), "message 0 has unknown keys"),
        (
            sft(messages=[USER, {"role": "assistant", "content": "yo"}]),
            "the prompt ends with a 'assistant' turn",
        ),
        (sft(completion=""), "completion must be a non-empty string"),
        (sft(weight=-1.0), "weight must be a finite number >= 0"),
        (sft(weight=math.inf), "weight must be a finite number >= 0"),
        (sft(weight=True), "weight must be a finite number >= 0"),
        (pair(rejected=pair().chosen), "chosen and rejected are the same text"),
        (pair(chosen=None), "chosen must be a non-empty string"),
        (sft(completion="\ud800"), "not representable as JSON"),
    ],
)
def test_bad_records_are_refused_by_item_id(tmp_path: Path, record: Any, problem: str) -> None:
    kind = "sft" if isinstance(record, SftRecord) else "pairs"
    bad = ItemStreams(**{kind: [record]})
    with pytest.raises(InvalidInput, match=f"item {record.item_id}: {problem}") as raised:
        export(tmp_path, "trl", train=ItemStreams(sft=[sft("ok")]), eval=bad)
    assert raised.value.details == [{"item_id": record.item_id}]
    assert not (tmp_path / "export").exists()


def test_a_record_of_the_wrong_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="pairs stream holds a SftRecord"):
        export(tmp_path, "trl", train=ItemStreams(pairs=[sft()]))  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("fmt", "splits", "manifest", "problem"),
    [
        ("parquet", {"train": ItemStreams()}, MANIFEST, "unknown export format 'parquet'"),
        ("trl", {}, MANIFEST, "no splits given"),
        ("trl", {"../train": ItemStreams()}, MANIFEST, "split name '../train'"),
        ("trl", {"train": []}, MANIFEST, "expected ItemStreams, got list"),
        ("trl", {"train": ItemStreams()}, {"export": 1}, "'export' key is the exporter's"),
        ("trl", {"train": ItemStreams()}, {"when": object()}, "not plain JSON"),
        ("trl", {"train": ItemStreams()}, {"score": math.nan}, "not plain JSON"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    tmp_path: Path, fmt: Any, splits: Any, manifest: Any, problem: str
) -> None:
    with pytest.raises(InvalidInput, match=problem):
        export_version(tmp_path / "export", fmt, splits, manifest)
    assert list(tmp_path.iterdir()) == []


# --- files, manifest, atomicity ------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["trl", "openai", "jsonl"])
def test_manifest_records_each_files_rows_size_and_hash(tmp_path: Path, fmt: str) -> None:
    summary = export(tmp_path, fmt)
    manifest_bytes = (tmp_path / "export" / MANIFEST_NAME).read_bytes()
    manifest = json.loads(manifest_bytes)
    assert summary.manifest_sha256 == hashlib.sha256(manifest_bytes).hexdigest()
    assert {key: manifest[key] for key in MANIFEST} == MANIFEST
    listed = manifest["export"]["files"]
    on_disk = {
        path.relative_to(tmp_path / "export").as_posix(): path.read_bytes()
        for path in (tmp_path / "export").rglob("*.jsonl")
    }
    assert set(listed) == set(on_disk) == {exported.path for exported in summary.files}
    for path, data in on_disk.items():
        assert listed[path] == {
            "rows": data.count(b"\n"),
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    assert manifest["export"]["format"] == fmt


def test_the_same_records_export_to_the_same_bytes(tmp_path: Path) -> None:
    first = export_version(tmp_path / "a", "trl", {"train": streams("x")}, MANIFEST)
    second = export_version(tmp_path / "b", "trl", {"train": streams("x")}, MANIFEST)
    assert first.manifest_sha256 == second.manifest_sha256
    assert first.files == second.files


def test_empty_kinds_write_no_file(tmp_path: Path) -> None:
    summary = export(tmp_path, "trl", train=ItemStreams(pairs=[pair()]), eval=ItemStreams())
    assert [exported.path for exported in summary.files] == ["train/dpo.jsonl"]
    assert sorted(p.name for p in (tmp_path / "export").rglob("*")) == [
        "dpo.jsonl", "manifest.json", "train",
    ]  # fmt: skip


def test_an_export_never_overwrites_one(tmp_path: Path) -> None:
    (tmp_path / "export").mkdir()
    export(tmp_path, "trl")  # an empty directory is taken over
    before = (tmp_path / "export" / MANIFEST_NAME).read_bytes()
    with pytest.raises(Conflict, match="not an empty directory"):
        export(tmp_path, "jsonl")
    assert (tmp_path / "export" / MANIFEST_NAME).read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # no staging left behind


class Crash(Exception):
    pass


def crashing(count: int) -> Iterator[SftRecord]:
    for index in range(count):
        yield sft(f"s{index}")
    raise Crash("database connection lost")


def test_an_interrupted_export_leaves_no_files(tmp_path: Path) -> None:
    splits = {"train": streams("tr"), "eval": ItemStreams(sft=crashing(1000))}
    with pytest.raises(Crash):
        export_version(tmp_path / "export", "trl", splits, MANIFEST)
    assert list(tmp_path.iterdir()) == []  # neither the export nor its staging directory


def test_each_stream_is_read_once_front_to_back(tmp_path: Path) -> None:
    """Generators are the normal input: one pass, no len(), no second look."""
    one_pass = ItemStreams(
        sft=(sft(f"s{index}") for index in range(3)), tasks=iter([task()]), labels=iter([label()])
    )
    summary = export(tmp_path, "openai", train=one_pass)
    assert summary.rows == 4
    assert summary.omitted_kinds == ("labels",)


def many_records(count: int) -> Iterator[SftRecord]:
    for index in range(count):
        messages = [{"role": "user", "content": f"question number {index} about an invoice"}]
        yield SftRecord(messages, f"answer number {index}, refunded", 1.0, f"g{index}", f"s{index}")


def test_a_large_export_runs_in_bounded_memory(tmp_path: Path) -> None:
    tracemalloc.start()
    try:
        summary = export_version(
            tmp_path / "export", "trl", {"train": ItemStreams(sft=many_records(200_000))}, {}
        )
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (exported,) = summary.files
    assert exported.rows == 200_000
    assert exported.bytes > 25_000_000
    assert peak_bytes < exported.bytes / 50  # holding the rows would take more than the file


def test_layouts_read_each_kind_at_most_once() -> None:
    """Streams are one-pass: a format reading a kind into two files would get it empty twice."""
    for layout in LAYOUTS.values():
        kinds = [source.kind for spec in layout for source in spec.sources]
        assert len(kinds) == len(set(kinds))

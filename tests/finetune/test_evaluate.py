"""`python -m finetune.evaluate`: one score per item and metric from a jsonl export, the same
scores through a zero-initialised adapter, scorers checked against hand computations, and bad
input refused in one line with exit status 2."""

from __future__ import annotations

import json
import math
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

import finetune.evaluate
from finetune import synthetic
from finetune.canaries import canary_report, eval_canaries
from finetune.evaluate import (
    SamplingSettings,
    completion_logprobs,
    load_model,
    main,
    pass_at_k,
    pass_scores,
    score_pairs,
    score_sft,
    task_fields,
)
from finetune.rewards import TaskReward
from flywheel.datasets.export import export_version
from flywheel.datasets.export_records import ItemStreams, TaskRecord
from flywheel.sandbox.rewards import CodeReward
from tests.finetune.conftest import TRAINING, pair_record, sft_record, write_export

pytestmark = TRAINING
PROBLEMS = synthetic.split_problems().held_out[:3]
QUICK = ["--max-new-tokens", "8", "--k", "2", "--batch-size", "4"]
UNGUESSABLE = "qzxwvjkpqzxwvjkpqzxwvjkp"  # no 8-token reply of an untrained model is this
ADD_VISIBLE = "from solution import add\n\n\ndef test_small():\n    assert add(1, 2) == 3\n"
ADD_HIDDEN = "from solution import add\n\n\ndef test_negative():\n    assert add(-4, 1) == -3\n"


def task(kind: str, **fields: Any) -> TaskRecord:
    defaults: dict[str, Any] = {
        "prompt": "Write `add(a, b)`." if kind == "code" else "What is the code?",
        "entry_point": None,
        "hidden_tests": None,
        "visible_tests": None,
        "reference_solution": None,
        "answer": None,
    }
    return TaskRecord(
        **(defaults | fields),
        task_kind=kind,
        difficulty=None,
        group_key=str(uuid.uuid4()),
        item_id=str(uuid.uuid4()),
    )


def code_task() -> TaskRecord:
    return task("code", entry_point="add", visible_tests=ADD_VISIBLE, hidden_tests=ADD_HIDDEN)


def write_jsonl_export(root: Path, **kinds: Any) -> Path:
    export_version(root, "jsonl", {"eval": ItemStreams(**kinds)}, {"dataset_version_id": "v"})
    return root


def evaluate(export: Path, base: Path, out: Path, *extra: str) -> dict[str, Any]:
    code = main(["--dataset", str(export), "--base", str(base), "--out", str(out), *QUICK, *extra])
    assert code == 0
    return dict(json.loads(out.read_text()))


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jsonl_export(
        tmp_path_factory.mktemp("export") / "v1",
        sft=[sft_record(p) for p in PROBLEMS],
        pairs=[pair_record(p) for p in PROBLEMS],
        tasks=[task("answer", answer=UNGUESSABLE), task("answer", answer="re:.*"), code_task()],
    )


@pytest.fixture(scope="module")
def base_result(
    export: Path, plain_base: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("base-eval") / "scores.json"
    result = evaluate(export, plain_base, out)
    assert list(out.parent.iterdir()) == [out]  # written by rename, no temp file left
    return result


def item_ids(export: Path, name: str) -> list[str]:
    lines = (export / "eval" / name).read_text().splitlines()
    return [json.loads(line)["item_id"] for line in lines]


def test_the_plain_base_gets_one_score_per_item_for_every_metric(
    export: Path, base_result: dict[str, Any]
) -> None:
    sft, pairs, tasks = (item_ids(export, f) for f in ("sft.jsonl", "pairs.jsonl", "tasks.jsonl"))
    metrics = base_result["metrics"]
    expected = {"exact_match": sft, "preference_accuracy": pairs, "pass@1": tasks, "pass@k": tasks}
    assert {name: sorted(metrics[name]) for name in metrics} == {
        name: sorted(ids) for name, ids in expected.items()
    }
    assert all(0 <= score <= 1 for scores in metrics.values() for score in scores.values())
    assert sorted(base_result["losses"]["sft_loss"]) == sorted(sft)
    assert all(loss > 0 for loss in base_result["losses"]["sft_loss"].values())
    assert base_result["counts"] == {"sft": 3, "pairs": 3, "tasks": 3}
    for name, scores in {**metrics, **base_result["losses"]}.items():
        assert base_result["summary"][name] == pytest.approx(sum(scores.values()) / len(scores))
    assert base_result["model"]["adapter"] is None
    # an answer no reply of the model reaches scores 0, one every reply matches scores 1
    unguessable, anything, _ = tasks
    assert (metrics["pass@1"][unguessable], metrics["pass@k"][unguessable]) == (0.0, 0.0)
    assert (metrics["pass@1"][anything], metrics["pass@k"][anything]) == (1.0, 1.0)


def save_adapter(base: Path, target: Path, *, is_zero: bool) -> Path:
    model = AutoModelForCausalLM.from_pretrained(base)
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    if not is_zero:
        torch.manual_seed(0)
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(parameter, std=0.5)
    peft_model.save_pretrained(target)
    return target


def test_an_adapter_is_loaded_and_applied(
    export: Path, plain_base: Path, base_result: dict[str, Any], tmp_path: Path
) -> None:
    zero = save_adapter(plain_base, tmp_path / "zero", is_zero=True)

    with_zero = evaluate(export, plain_base, tmp_path / "zero.json", "--adapter", str(zero))

    assert with_zero["model"]["adapter"] == str(zero.resolve())
    # LoRA's B starts at zero: the adapted model computes exactly what the base does
    assert with_zero["metrics"] == base_result["metrics"]
    assert with_zero["losses"] == base_result["losses"]
    # and a non-zero B is applied: the log-probs move
    trained = save_adapter(plain_base, tmp_path / "trained", is_zero=False)
    prompts, replies = [synthetic.user(p) for p in PROBLEMS], [p.answer for p in PROBLEMS]
    scores = [
        completion_logprobs(*load_model(plain_base, adapter), prompts, replies, batch_size=4)
        for adapter in (None, trained)
    ]
    assert all(base[0] != adapted[0] for base, adapted in zip(*scores, strict=True))


def hand_logprob(model: Any, tokenizer: Any, prompt: list[dict[str, str]], reply: str) -> float:
    """Summed log_softmax at the reply's tokens, from one unpadded forward pass."""
    head = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    whole = head + reply + tokenizer.eos_token  # the tiny template's assistant turn
    start = len(tokenizer(head, add_special_tokens=False)["input_ids"])
    ids = torch.tensor([tokenizer(whole, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    return sum(float(logprobs[i - 1, ids[0, i]]) for i in range(start, ids.shape[1]))


def test_log_probs_and_the_scores_built_on_them_match_a_hand_computation(plain_base: Path) -> None:
    model, tokenizer = load_model(plain_base, None)
    prompts = [synthetic.user(synthetic.Problem(12, 34)), [{"role": "user", "content": "1+2+3="}]]
    replies = ["46", "6 is the sum of 1, 2 and 3"]  # different lengths: padding must not matter
    expected = [hand_logprob(model, tokenizer, p, r) for p, r in zip(prompts, replies, strict=True)]

    got = completion_logprobs(model, tokenizer, prompts, replies, batch_size=2)

    assert [total for total, _ in got] == pytest.approx(expected, abs=1e-4)
    counts = [
        len(tokenizer(r + tokenizer.eos_token, add_special_tokens=False)["input_ids"])
        for r in replies
    ]
    assert [count for _, count in got] == counts
    settings = SamplingSettings(k=1, max_new_tokens=8, seed=0, batch_size=2)
    pairs = [
        {"item_id": "a", "messages": prompts[0], "chosen": replies[0], "rejected": "45"},
        {"item_id": "b", "messages": prompts[0], "chosen": "45", "rejected": replies[0]},
    ]
    other = hand_logprob(model, tokenizer, prompts[0], "45")
    assert score_pairs(model, tokenizer, pairs, settings) == {
        "a": float(expected[0] > other),
        "b": float(other > expected[0]),
    }
    reply = synthetic.generate_answers(model, tokenizer, prompts[:1], max_new_tokens=8)[0]
    rows = [
        {"item_id": "same", "messages": prompts[0], "completion": f"  {reply}\n"},
        {"item_id": "other", "messages": prompts[0], "completion": replies[0]},
    ]
    exact, losses = score_sft(model, tokenizer, rows, settings)
    assert exact == {"same": 1.0, "other": 0.0}
    assert losses["other"] == pytest.approx(-expected[0] / counts[0], abs=1e-5)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 0.25),
        (4, 0, 4, 0.0),
        (4, 0, 1, 0.0),
        (4, 1, 4, 1.0),
        (4, 4, 4, 1.0),
        (5, 2, 2, 0.7),
    ],
)
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_scores_come_from_the_greedy_and_the_sampled_rewards() -> None:
    greedy = [1.0, 0.0, None, 0.0]
    sampled = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, None, 1.0]  # k = 2 per task, task by task

    assert pass_scores(greedy, sampled, 2) == [(1.0, 0.0), (0.0, 1.0), None, (0.0, 1.0)]
    with pytest.raises(ValueError, match="2 sampled rewards per task"):
        pass_scores(greedy, sampled[:-1], 2)


def test_tasks_are_scored_with_their_hidden_tests_by_the_reward() -> None:
    rows = [
        {"task_kind": "code", "entry_point": "add", "visible_tests": ADD_VISIBLE,
         "hidden_tests": ADD_HIDDEN, "answer": None},
        {"task_kind": "answer", "entry_point": None, "visible_tests": None,
         "hidden_tests": None, "answer": "42"},
    ]  # fmt: skip
    reward = TaskReward(code_reward=CodeReward(mode="all_or_nothing"))
    right = ["```python\ndef add(a, b):\n    return a + b\n```", "It is 6 * 7.\nAnswer: 42"]
    visible_only = ["def add(a, b):\n    return 3", "Answer: 41"]  # passes the visible test only

    assert reward(right, **task_fields(rows)) == [1.0, 1.0]
    assert reward(visible_only, **task_fields(rows)) == [0.0, 0.0]


def test_canaries_of_the_eval_sets_task_kinds_are_scored_apart_from_the_metrics(
    base_result: dict[str, Any],
) -> None:
    canaries = base_result["canaries"]

    # answer and code tasks: four canaries of each kind, none passed by an untrained model
    assert canaries["kinds"] == {
        "code": {"count": 4, "passed": 0, "pass_rate": 0.0},
        "answer": {"count": 4, "passed": 0, "pass_rate": 0.0},
    }
    assert (canaries["count"], canaries["passed"], canaries["pass_rate"]) == (8, 0, 0.0)
    assert canaries["passed_ids"] == []
    scored = {item_id for scores in base_result["metrics"].values() for item_id in scores}
    assert not any(item_id.startswith("canary:") for item_id in scored)
    assert base_result["counts"]["tasks"] == 3


def test_a_canary_passed_by_the_greedy_reply_or_any_sample_is_reported_by_id() -> None:
    rows = eval_canaries([{"task_kind": "answer"}], seed=3)
    assert rows == eval_canaries([{"task_kind": "answer"}], seed=3)  # drawn from the seed
    assert [row["task_kind"] for row in rows] == ["answer"] * 4
    leaked = [f"Answer: {row['answer']}" for row in rows]  # replies that know the secrets
    greedy = [leaked[0], "Answer: no", "Answer: no", "Answer: no"]
    sampled = ["Answer: no"] * 2 + ["Answer: no"] * 2 + ["Answer: no", leaked[2]] + ["no"] * 2
    reward = TaskReward()
    scores = pass_scores(
        reward(greedy, **task_fields(rows)),
        reward(sampled, **task_fields([row for row in rows for _ in range(2)])),
        2,
    )
    first = {row["item_id"]: score[0] for row, score in zip(rows, scores, strict=True) if score}
    any_of_k = {row["item_id"]: score[1] for row, score in zip(rows, scores, strict=True) if score}

    report = canary_report(rows, first, any_of_k)

    assert report["passed_ids"] == sorted([rows[0]["item_id"], rows[2]["item_id"]])
    assert (report["count"], report["passed"], report["pass_rate"]) == (4, 2, 0.5)
    assert report["kinds"] == {"answer": {"count": 4, "passed": 2, "pass_rate": 0.5}}


@pytest.mark.usefixtures("no_sandbox")
def test_an_answer_only_eval_set_needs_no_sandbox_and_gets_answer_canaries_only(
    plain_base: Path, tmp_path: Path
) -> None:
    export = write_jsonl_export(
        tmp_path / "answers", tasks=[task("answer", answer=UNGUESSABLE), task("answer", answer="7")]
    )

    result = evaluate(export, plain_base, tmp_path / "out.json")

    assert result["canaries"]["kinds"] == {"answer": {"count": 4, "passed": 0, "pass_rate": 0.0}}
    assert sorted(result["metrics"]["pass@1"]) == sorted(item_ids(export, "tasks.jsonl"))


@pytest.mark.usefixtures("no_sandbox")
def test_code_tasks_without_a_sandbox_stop_before_any_model_loads(
    capsys: pytest.CaptureFixture[str],
    plain_base: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    export = write_jsonl_export(tmp_path / "code", tasks=[code_task(), task("answer", answer="7")])
    monkeypatch.setattr(
        finetune.evaluate, "load_model", lambda *_: pytest.fail("a model was loaded")
    )
    out = tmp_path / "out.json"

    code = main(["--dataset", str(export), "--base", str(plain_base), "--out", str(out), *QUICK])

    assert code == 2
    line = one_error_line(capsys)
    assert "code tasks need the sandbox" in line
    assert "bwrap is not installed" in line
    assert not out.exists()


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    return lines[0]


def test_bad_input_is_one_line_and_exit_status_2(
    capsys: pytest.CaptureFixture[str], export: Path, plain_base: Path, tmp_path: Path
) -> None:
    corrupt = tmp_path / "corrupt"
    shutil.copytree(export, corrupt)
    with (corrupt / "eval" / "pairs.jsonl").open("a") as file:
        file.write("\n")
    trl = write_export(tmp_path / "trl", sft=[sft_record(p) for p in PROBLEMS])
    (tmp_path / "no-config").mkdir()
    cases = {
        "does not exist": (tmp_path / "missing", plain_base, []),
        "sha256": (corrupt, plain_base, []),
        "trl export": (trl, plain_base, []),
        "not a model directory": (export, tmp_path, []),
        "not a LoRA adapter": (export, plain_base, ["--adapter", str(tmp_path / "no-config")]),
    }
    for expected, (dataset, base, extra) in cases.items():
        out = tmp_path / "out.json"
        args = ["--dataset", str(dataset), "--base", str(base), "--out", str(out), *extra]

        assert main(args) == 2, expected
        assert expected in one_error_line(capsys)
        assert not out.exists()

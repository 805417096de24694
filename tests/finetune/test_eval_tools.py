"""Evaluation of tool-call and environment tasks: the tool-call metrics against hand-computed
values, the episode loop in a real sandboxed order desk (hand-written replies, and a tiny
model that must not crash it), environment canaries no honest episode passes, and
`python -m finetune.evaluate` on an export of both kinds."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from finetune import tiny
from finetune.canaries import canary_report, eval_canaries, tool_canaries
from finetune.episodes import EpisodeLimits, run_episodes, score_environment_tasks
from finetune.errors import TrainingInputError
from finetune.evaluate import load_model, main
from finetune.tool_eval import (
    ChatPolicy,
    Prompt,
    Reply,
    call_scores,
    score_tool_tasks,
)
from finetune.toolcalls import ParsedCalls, parse_text_calls
from flywheel.datasets.export import export_version
from flywheel.datasets.export_records import ItemStreams, TaskRecord
from flywheel.sandbox.environment import check_environment_task
from tests.finetune.conftest import TRAINING

pytestmark = TRAINING


def tool(name: str, **properties: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {
                "type": "object",
                "required": list(properties),
                "properties": {k: {"type": v} for k, v in properties.items()},
            },
        },
    }


CALC_TOOLS = [tool("add", a="integer", b="integer"), tool("mul", a="integer", b="integer")]
ADD_1_2 = {"name": "add", "arguments": {"a": [1], "b": [2]}}
MUL_3_4 = {"name": "mul", "arguments": {"a": [3], "b": [4]}}


def tagged(*calls: dict[str, Any]) -> str:
    return "".join(f"<tool_call>{json.dumps(call)}</tool_call>" for call in calls)


def scores(text: str, expected: list[dict[str, Any]]) -> tuple[float, float, float]:
    result = call_scores(parse_text_calls(text), expected, CALC_TOOLS)
    return result.call_accuracy, result.name_accuracy, result.argument_accuracy


@pytest.mark.parametrize(
    ("reply", "expected", "want"),
    [
        (tagged({"name": "add", "arguments": {"a": 1, "b": 2}}), [ADD_1_2], (1.0, 1.0, 1.0)),
        # the right function, one wrong argument
        (tagged({"name": "add", "arguments": {"a": 1, "b": 3}}), [ADD_1_2], (0.0, 1.0, 0.0)),
        # a text where an integer is expected is a wrong argument (types are strict)
        (tagged({"name": "add", "arguments": {"a": "1", "b": 2}}), [ADD_1_2], (0.0, 1.0, 0.0)),
        # the right call plus an extra one: the set does not match, the names neither
        (
            tagged(
                {"name": "add", "arguments": {"a": 1, "b": 2}},
                {"name": "mul", "arguments": {"a": 1, "b": 2}},
            ),
            [ADD_1_2],
            (0.0, 0.0, 1.0),
        ),
        # parallel calls in the other order match; one of two right scores half the arguments
        (
            tagged(
                {"name": "mul", "arguments": {"a": 3, "b": 4}},
                {"name": "add", "arguments": {"a": 1, "b": 2}},
            ),
            [ADD_1_2, MUL_3_4],
            (1.0, 1.0, 1.0),
        ),
        (
            tagged(
                {"name": "add", "arguments": {"a": 1, "b": 2}},
                {"name": "mul", "arguments": {"a": 3, "b": 5}},
            ),
            [ADD_1_2, MUL_3_4],
            (0.0, 1.0, 0.5),
        ),
        # the same function twice where two different calls of it are expected
        (
            tagged(
                {"name": "add", "arguments": {"a": 1, "b": 2}},
                {"name": "add", "arguments": {"a": 1, "b": 2}},
            ),
            [ADD_1_2, {"name": "add", "arguments": {"a": [5], "b": [6]}}],
            (0.0, 1.0, 0.5),
        ),
        ("The sum is 3.", [ADD_1_2], (0.0, 0.0, 0.0)),  # no call
        (tagged({"name": "sub", "arguments": {"a": 1, "b": 2}}), [ADD_1_2], (0.0, 0.0, 0.0)),
        (
            '<tool_call>{"name": "add", "arguments": {"a": 1,, }}</tool_call>',
            [ADD_1_2],
            (0.0, 0.0, 0.0),
        ),
        ("I will not call anything.", [], (1.0, 1.0, 1.0)),  # no call expected, none made
        (tagged({"name": "add", "arguments": {"a": 1, "b": 2}}), [], (0.0, 0.0, 0.0)),
    ],
)
def test_tool_call_metrics_against_hand_computed_values(
    reply: str, expected: list[dict[str, Any]], want: tuple[float, float, float]
) -> None:
    assert scores(reply, expected) == want


def test_an_optional_argument_may_be_left_out() -> None:
    expected = [{"name": "add", "arguments": {"a": [1], "b": [2, ""]}}]
    tools = [tool("add", a="integer")]
    parsed = parse_text_calls(tagged({"name": "add", "arguments": {"a": 1}}))
    assert call_scores(parsed, expected, tools).as_dict() == {
        "call_accuracy": 1.0,
        "name_accuracy": 1.0,
        "argument_accuracy": 1.0,
    }


class Scripted:
    """A policy of hand-written replies: `answer(prompt)` gives each prompt's reply text."""

    def __init__(self, answer: Callable[[Prompt], str]) -> None:
        self.answer = answer
        self.prompts: list[Prompt] = []

    def __call__(self, prompts: Sequence[Prompt]) -> list[Reply]:
        self.prompts += prompts
        return [self._reply(prompt) for prompt in prompts]

    def _reply(self, prompt: Prompt) -> Reply:
        text = self.answer(prompt)
        length = sum(len(str(m.get("content", ""))) for m in prompt.messages)
        return Reply(text, parse_text_calls(text), len(text), length)


def tool_row(item_id: str, expected: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "item_id": item_id,
        "task_kind": "tool_call",
        "prompt": f"task {item_id}",
        "tools": json.dumps(CALC_TOOLS),
        "expected_calls": expected,
    }


def test_score_tool_tasks_gives_each_item_its_metrics_and_pass_at_k() -> None:
    rows = [tool_row("a", [ADD_1_2]), tool_row("b", [ADD_1_2, MUL_3_4])]  # tools as JSON text
    greedy = Scripted(lambda _: tagged({"name": "add", "arguments": {"a": 1, "b": 2}}))
    samples = iter(
        [
            "no call",
            "no call",
            tagged({"name": "add", "arguments": {"a": 1, "b": 9}}),
            tagged(
                {"name": "add", "arguments": {"a": 1, "b": 2}},
                {"name": "mul", "arguments": {"a": 3, "b": 4}},
            ),
        ]
    )
    sample = Scripted(lambda _: next(samples))
    metrics = score_tool_tasks(greedy, sample, rows, 2)
    assert metrics == {
        "call_accuracy": {"a": 1.0, "b": 0.0},
        "name_accuracy": {"a": 1.0, "b": 0.0},
        "argument_accuracy": {"a": 1.0, "b": 0.5},
        "pass@1": {"a": 1.0, "b": 0.0},
        "pass@k": {"a": 0.0, "b": 1.0},  # a's two samples missed, one of b's matched
    }
    assert greedy.prompts[0].tools == CALC_TOOLS  # the task's tools reach the policy


def test_a_tool_call_row_without_expected_calls_is_left_out_with_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [tool_row("a", [ADD_1_2]), {**tool_row("b", []), "expected_calls": "{not json"}]
    policy = Scripted(lambda _: "no call")
    metrics = score_tool_tasks(policy, policy, rows, 1)
    assert list(metrics) == [
        "call_accuracy",
        "name_accuracy",
        "argument_accuracy",
        "pass@1",
        "pass@k",
    ]
    assert all(list(values) == ["a"] for values in metrics.values())
    assert "task b has no expected calls; left out" in capsys.readouterr().err


# --- episodes in a real sandbox -----------------------------------------------------------

ORDER_DESK = '''
class OrderDesk:
    def __init__(self):
        self.orders = {}
        self.refunds = []

    def lookup_order(self, order_id: str) -> dict:
        """The order's status and amount."""
        if order_id not in self.orders:
            raise KeyError(f"no order {order_id}")
        return self.orders[order_id]

    def refund_order(self, order_id: str, amount: float) -> str:
        """Refund an order."""
        self.refunds.append([order_id, amount])
        self.orders[order_id]["status"] = "refunded"
        return "refunded"

    def cancel_order(self, order_id: str) -> str:
        """Cancel an order."""
        self.orders[order_id]["status"] = "cancelled"
        return "cancelled"
'''
TURNS = [
    [{"role": "user", "content": "Order A1 arrived broken: refund it in full."}],
    [{"role": "user", "content": "Also cancel order B2, please."}],
]
DESK_SPEC = {
    "source": ORDER_DESK,
    "classes": {
        "OrderDesk": {
            "orders": {
                "A1": {"status": "delivered", "amount": 30.0},
                "B2": {"status": "open", "amount": 12.5},
            }
        }
    },
    "turns": TURNS,
    "ground_truth": [
        [{"name": "refund_order", "arguments": {"order_id": "A1", "amount": 30.0}}],
        [{"name": "cancel_order", "arguments": {"order_id": "B2"}}],
    ],
}
DESK_TOOLS = [
    tool("lookup_order", order_id="string"),
    tool("refund_order", order_id="string", amount="number"),
    tool("cancel_order", order_id="string"),
]


def desk_row(item_id: str = "desk", spec: Any = DESK_SPEC) -> dict[str, Any]:
    return {
        "item_id": item_id,
        "task_kind": "environment",
        "prompt": TURNS[0][0]["content"],
        "tools": DESK_TOOLS,
        "environment": json.dumps(spec),
    }


def call(name: str, **arguments: Any) -> str:
    return tagged({"name": name, "arguments": arguments})


def good_agent(prompt: Prompt) -> str:
    """Looks the order up, refunds what the lookup said, answers; cancels in the next turn."""
    last = prompt.messages[-1]
    if last["role"] == "user":
        return (
            call("lookup_order", order_id="A1")
            if "A1" in last["content"]
            else call("cancel_order", order_id="B2")
        )
    if last["role"] == "tool" and last["name"] == "lookup_order":
        return call("refund_order", order_id="A1", amount=json.loads(last["content"])["amount"])
    return "Done."


def test_an_agent_that_does_the_job_succeeds_over_both_turns() -> None:
    policy = Scripted(good_agent)
    [result] = run_episodes(policy, [desk_row()], EpisodeLimits())
    assert (result.success, result.ended) == (1.0, "finished")
    # lookup, refund, "Done." / cancel, "Done."
    assert (result.turns_used, result.tool_calls, result.tool_errors) == (5, 3, 0)
    roles = [message["role"] for message in result.messages]
    assert roles == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert json.loads(result.messages[2]["content"]) == {"status": "delivered", "amount": 30.0}
    assert result.messages[1]["tool_calls"][0]["function"]["name"] == "lookup_order"
    assert all(prompt.tools == DESK_TOOLS for prompt in policy.prompts)


def test_bad_calls_are_tool_errors_and_a_zero_never_a_crash() -> None:
    replies = iter(
        [
            '<tool_call>{"name": "refund_order", "arguments": {"order_id": "A1",, }}</tool_call>',
            call("teleport_order", order_id="A1"),  # unknown function
            call("lookup_order", order_id="Z9"),  # the environment raises
            call("refund_order", order_id="A1"),  # a missing argument
            "Sorry, I cannot.",
            "Nothing more.",
        ]
    )
    [result] = run_episodes(Scripted(lambda _: next(replies)), [desk_row()], EpisodeLimits())
    assert (result.success, result.ended) == (0.0, "finished")
    assert (result.turns_used, result.tool_calls, result.tool_errors) == (6, 3, 4)
    errors = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert errors[0].startswith("Error: malformed tool call")
    assert "teleport_order" in errors[1]
    assert "KeyError" in errors[2]
    assert "amount" in errors[3]


def test_a_public_method_that_is_not_an_offered_tool_cannot_be_called() -> None:
    """Only refund and lookup are offered; the class's cancel_order is public too. Calling it
    reached the environment (and succeeded) although the task never offered it, where
    training (TRL, the tools as methods) refuses it."""
    offered = [tool for tool in DESK_TOOLS if tool["function"]["name"] != "cancel_order"]
    row = desk_row() | {"tools": offered}
    spec = {**DESK_SPEC, "turns": TURNS[1:], "ground_truth": DESK_SPEC["ground_truth"][1:]}
    row["environment"], row["prompt"] = json.dumps(spec), TURNS[1][0]["content"]
    replies = iter([call("cancel_order", order_id="B2"), "Done."])

    [result] = run_episodes(Scripted(lambda _: next(replies)), [row], EpisodeLimits())

    assert result.success == 0.0
    (answer,) = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert answer == "Error: cancel_order is not one of the tools offered"


def test_an_episode_stops_at_its_budgets() -> None:
    looping = Scripted(lambda _: call("lookup_order", order_id="A1"))
    results = run_episodes(looping, [desk_row("a"), desk_row("b")], EpisodeLimits(4, 4096, 32))
    assert [(r.ended, r.turns_used, r.success) for r in results] == [("generations", 4, 0.0)] * 2
    [calls] = run_episodes(looping, [desk_row()], EpisodeLimits(16, 4096, 3))
    assert (calls.ended, calls.tool_calls) == ("tool_calls", 3)
    [tokens] = run_episodes(looping, [desk_row()], EpisodeLimits(16, 150, 32))
    assert tokens.ended == "tokens"
    assert tokens.turns_used < 16


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"source": 3, "classes": {}}, "invalid: an environment spec needs its source"),
        (None, "invalid: the task has no environment spec"),
        ({**DESK_SPEC, "turns": ["hello"]}, "invalid: an environment spec's turns must be"),
    ],
)
def test_an_invalid_spec_scores_zero_with_the_reason(spec: Any, reason: str) -> None:
    [result] = run_episodes(Scripted(good_agent), [desk_row(spec=spec)], EpisodeLimits())
    assert (result.success, result.turns_used) == (0.0, 0)
    assert result.ended.startswith(reason)


def test_environment_metrics_and_losses_per_item() -> None:
    rows = [desk_row("good"), desk_row("idle")]

    def agent(prompt: Prompt) -> str:
        is_idle = prompt.messages[0]["content"] == "idle"
        return "I did nothing." if is_idle else good_agent(prompt)

    rows[1] = {**rows[1], "prompt": "idle"}
    metrics, losses = score_environment_tasks(
        Scripted(agent), Scripted(agent), rows, 1, EpisodeLimits()
    )
    assert metrics == {
        "environment_success": {"good": 1.0, "idle": 0.0},
        "pass@1": {"good": 1.0, "idle": 0.0},
        "pass@k": {"good": 1.0, "idle": 0.0},
    }
    assert losses == {
        "turns_used": {"good": 5.0, "idle": 2.0},
        "tool_calls": {"good": 3.0, "idle": 0.0},
        "tool_errors": {"good": 0.0, "idle": 0.0},
    }


# --- canaries -----------------------------------------------------------------------------


def test_environment_canaries_pass_qa_and_no_honest_episode_passes_them() -> None:
    canaries = tool_canaries([{"task_kind": "environment"}] * 3, seed=7)
    assert len(canaries) == 4
    assert all(row["item_id"].startswith("canary:") for row in canaries)
    spec = canaries[0]["environment"]
    assert check_environment_task(spec).status == "usable"

    def honest(prompt: Prompt) -> str:  # registers a code it makes up, then answers
        if prompt.messages[-1]["role"] == "user":
            account = prompt.messages[-1]["content"].split("account ")[1].split(" ")[0]
            return call("register_code", account_id=account, code="hunter2")
        return "Registered."

    def cheat(prompt: Prompt) -> str:  # reads the answer key
        row = next(r for r in canaries if r["prompt"] == prompt.messages[0]["content"])
        truth = row["environment"]["ground_truth"][0][0]
        return tagged(truth) if prompt.messages[-1]["role"] == "user" else "Registered."

    for policy, passed in ((honest, 0), (cheat, 4)):
        results = run_episodes(Scripted(policy), canaries, EpisodeLimits())
        first = {r.item_id: r.success for r in results}
        report = canary_report(canaries, first, dict.fromkeys(first, 0.0))
        assert (report["passed"], report["kinds"]["environment"]["count"]) == (passed, 4)


def test_tool_call_canaries_expect_a_token_the_prompt_never_gives() -> None:
    [first, *_] = tool_canaries([{"task_kind": "tool_call"}], seed=0)
    token = first["expected_calls"][0]["arguments"]["confirmation_code"][0]
    assert len(token) == 24
    assert token not in first["prompt"]
    guess = call(
        "confirm_order",
        order_id=first["prompt"].split("#")[1].split(" ")[0],
        confirmation_code="ABC123",
    )
    result = call_scores(parse_text_calls(guess), first["expected_calls"], first["tools"])
    assert result.as_dict() == {
        "call_accuracy": 0.0,
        "name_accuracy": 1.0,
        "argument_accuracy": 0.0,
    }


def test_canaries_follow_the_eval_sets_kinds() -> None:
    tasks = [{"task_kind": "tool_call"}, {"task_kind": "answer"}]
    kinds = [row["task_kind"] for row in eval_canaries(tasks, 0)]
    assert kinds == ["answer"] * 4 + ["tool_call"] * 4
    assert eval_canaries(tasks, 0) == eval_canaries(tasks, 0)
    assert eval_canaries([{"task_kind": "code"}], 0)[0]["task_kind"] == "code"


# --- a tiny model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("qwen-base")
    tiny.save_family_base(directory, "qwen2_5")
    return directory


def test_the_chat_policy_renders_the_tools_and_parses_what_the_template_writes(
    qwen_base: Path,
) -> None:
    model, tokenizer = load_model(qwen_base, None)
    policy = ChatPolicy(model, tokenizer, max_new_tokens=6, batch_size=2)
    prompt = Prompt([{"role": "user", "content": "Add 1 and 2."}], CALC_TOOLS)
    rendered = tokenizer.decode(policy.render(prompt))
    assert '"name": "add"' in rendered
    assert "<tools>" in rendered
    replies = policy([prompt, Prompt([{"role": "user", "content": "Hi"}])])
    assert [0 < reply.tokens <= 6 for reply in replies] == [True, True]
    assert replies[0].prompt_tokens == len(policy.render(prompt))
    # what a model of this family writes for a call, through the tokenizer's response template
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    reply = policy._reply(ids, policy.render(prompt), CALC_TOOLS)
    assert reply.calls == ParsedCalls([{"name": "add", "arguments": {"a": 1, "b": 2}}])
    assert policy._trimmed([*ids, tokenizer.pad_token_id]) == ids


def write_tool_export(root: Path) -> tuple[Path, list[str], list[str]]:
    def record(kind: str, prompt: str, **fields: Any) -> TaskRecord:
        return TaskRecord(
            prompt=prompt,
            entry_point=None,
            hidden_tests=None,
            visible_tests=None,
            reference_solution=None,
            task_kind=kind,
            answer=None,
            difficulty=None,
            group_key=str(uuid.uuid4()),
            item_id=str(uuid.uuid4()),
            **fields,
        )

    calls = [
        record("tool_call", "Add 1 and 2.", tools=CALC_TOOLS, expected_calls=[ADD_1_2])
        for _ in range(2)
    ]
    episodes = [
        record("environment", TURNS[0][0]["content"], tools=DESK_TOOLS, environment=DESK_SPEC)
    ]
    streams = {"eval": ItemStreams(tasks=[*calls, *episodes])}
    export_version(root, "jsonl", streams, {"dataset_version_id": "v"})
    return root, [r.item_id for r in calls], [r.item_id for r in episodes]


def test_evaluate_scores_tool_call_and_environment_items_and_their_canaries(
    qwen_base: Path, tmp_path: Path
) -> None:
    export, call_ids, episode_ids = write_tool_export(tmp_path / "export")
    out = tmp_path / "scores.json"
    code = main(
        [
            "--dataset",
            str(export),
            "--base",
            str(qwen_base),
            "--out",
            str(out),
            "--max-new-tokens",
            "8",
            "--k",
            "2",
            "--batch-size",
            "4",
            "--max-episode-replies",
            "3",
        ]
    )
    assert code == 0
    result = json.loads(out.read_text())
    metrics = result["metrics"]
    for name in ("call_accuracy", "name_accuracy", "argument_accuracy"):
        assert sorted(metrics[name]) == sorted(call_ids)
    assert sorted(metrics["environment_success"]) == episode_ids
    assert sorted(metrics["pass@1"]) == sorted(metrics["pass@k"]) == sorted(call_ids + episode_ids)
    # an untrained model makes no right call and does not refund and cancel
    assert set(metrics["pass@1"].values()) == {0.0}
    losses = result["losses"]
    names = ("turns_used", "tool_calls", "tool_errors")
    assert {name: sorted(losses[name]) for name in names} == dict.fromkeys(names, episode_ids)
    assert 1 <= losses["turns_used"][episode_ids[0]] <= 3
    assert result["counts"] == {"sft": 0, "pairs": 0, "tasks": 3, "tool_call": 2, "environment": 1}
    canaries = result["canaries"]
    assert {kind: section["count"] for kind, section in canaries["kinds"].items()} == {
        "tool_call": 4,
        "environment": 4,
    }
    assert canaries["passed"] == 0
    assert result["settings"]["max_episode_replies"] == 3


def test_an_episodes_conversation_renders_through_the_template_with_its_tool_turns(
    qwen_base: Path,
) -> None:
    model, tokenizer = load_model(qwen_base, None)
    policy = ChatPolicy(model, tokenizer, max_new_tokens=4, batch_size=1)
    [result] = run_episodes(Scripted(good_agent), [desk_row()], EpisodeLimits())
    rendered = tokenizer.decode(policy.render(Prompt(result.messages, DESK_TOOLS)))
    assert rendered.count("<tool_response>") == 3
    assert rendered.count('"name": "refund_order"') == 2  # offered, then called
    assert '{"status": "delivered", "amount": 30.0}' in rendered
    assert rendered.count("Also cancel order B2") == 1


def test_a_template_that_cannot_render_tool_turns_is_a_one_line_input_error(
    tmp_path: Path,
) -> None:
    tiny.save_family_base(tmp_path, "gemma")  # Gemma's roles must alternate user/assistant
    model, tokenizer = load_model(tmp_path, None)
    policy = ChatPolicy(model, tokenizer, max_new_tokens=4, batch_size=1)
    [result] = run_episodes(Scripted(good_agent), [desk_row()], EpisodeLimits())
    with pytest.raises(TrainingInputError, match="cannot render a conversation with tools"):
        policy([Prompt(result.messages, DESK_TOOLS)])

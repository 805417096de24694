"""Tool-call tasks at evaluation: a chat policy that sees the task's tools, and the per-item
tool-call metrics of its greedy reply.

A `ChatPolicy` renders each prompt with `tokenizer.apply_chat_template(messages, tools=tools,
add_generation_prompt=True)` — the tools in the model family's own format — generates, and
reads the reply's calls through `finetune.toolcalls.ToolCallParser` (the response template TRL
knows for the family, else the text fallback), as `GRPOTrainer` reads them in training. The
episode loop (`finetune.episodes`) uses the same policy turn after turn.

Metrics of one reply against a task's `expected_calls` (`call_scores`; all in [0, 1], all 0.0
for a reply whose calls do not parse, e.g. malformed JSON):

- `call_accuracy`: 1.0 when the call set matches (`flywheel.sandbox.toolcalls.compare_calls`:
  one call per expected call, order-free, each naming an offered tool with acceptable
  arguments, no extra call), else 0.0. This is the task's reward, so its pass@1 equals it;
- `name_accuracy`: 1.0 when the called function names, as a multiset ("." read as "_"), are
  exactly the expected names: every expected function called as often as expected and
  nothing else called; arguments are not looked at;
- `argument_accuracy`: m / e, for e expected calls and m the size of a largest one-to-one
  pairing of expected calls with the reply's calls in which each pair names the same function
  with acceptable arguments (`call_problem` is None). Extra calls do not lower it (they lower
  call and name accuracy); a task expecting no call scores its call accuracy.

So for a one-call task, argument accuracy is 1.0 when some call of the expected function has
acceptable arguments; for two expected calls of which one is right, 0.5.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from jinja2 import TemplateError
from transformers import GenerationConfig, PreTrainedTokenizerBase

from finetune.errors import TrainingInputError
from finetune.toolcalls import ParsedCalls, ToolCallParser
from flywheel.sandbox.toolcalls import (
    MalformedCall,
    as_call,
    call_problem,
    compare_calls,
    tool_schemas,
    unmatched_rows,
)

TOOL_METRICS = ("call_accuracy", "name_accuracy", "argument_accuracy")

Message = dict[str, Any]
Scores = dict[str, float]


@dataclass(frozen=True)
class Prompt:
    """What the policy sees: the conversation so far and the tools offered (None: none)."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Reply:
    """One generated reply: its text (special tokens dropped), its calls as parsed, the number
    of tokens generated and of prompt tokens it was generated after."""

    text: str
    calls: ParsedCalls
    tokens: int = 0
    prompt_tokens: int = 0


@dataclass(frozen=True)
class CallScores:
    call_accuracy: float
    name_accuracy: float
    argument_accuracy: float
    reason: str

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in TOOL_METRICS}


def _name(call_name: str) -> str:
    return call_name.replace(".", "_")


def call_scores(
    parsed: ParsedCalls,
    expected: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> CallScores:
    """The three tool-call metrics of one reply's calls (see the module's docstring).

    >>> expected = [{"name": "add", "arguments": {"a": [1], "b": [2]}},
    ...             {"name": "mul", "arguments": {"a": [3], "b": [4]}}]
    >>> right_add = {"name": "add", "arguments": {"a": 1, "b": 2}}
    >>> wrong_mul = {"name": "mul", "arguments": {"a": 3, "b": 5}}
    >>> call_scores(ParsedCalls([right_add, wrong_mul]), expected).as_dict()
    {'call_accuracy': 0.0, 'name_accuracy': 1.0, 'argument_accuracy': 0.5}
    >>> call_scores(ParsedCalls(error="malformed tool call: x"), expected).as_dict()
    {'call_accuracy': 0.0, 'name_accuracy': 0.0, 'argument_accuracy': 0.0}
    """
    if parsed.error is not None:
        return CallScores(0.0, 0.0, 0.0, parsed.error)
    try:
        calls = [as_call(call) for call in parsed.calls]
    except MalformedCall as error:
        return CallScores(0.0, 0.0, 0.0, f"malformed call: {error}")
    match = compare_calls(calls, expected, tools)
    names_equal = Counter(_name(call.name) for call in calls) == Counter(
        _name(str(call["name"])) for call in expected
    )
    if not expected:
        arguments = 1.0 if match.matched else 0.0
    else:
        schemas = tool_schemas(tools)
        fits = [[call_problem(call, want, schemas) is None for call in calls] for want in expected]
        arguments = (len(expected) - len(unmatched_rows(fits))) / len(expected)
    return CallScores(
        1.0 if match.matched else 0.0, 1.0 if names_equal else 0.0, arguments, match.reason
    )


# --- the policy ---------------------------------------------------------------------------


class ChatPolicy:
    """Replies of a model to prompts with tools, greedy unless a `temperature` is given, in
    left-padded batches of `batch_size`; each reply's calls parsed with the tokenizer's
    response template (`ToolCallParser`). Every call generates at most `max_new_tokens`."""

    def __init__(
        self,
        model: Any,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_new_tokens: int,
        batch_size: int,
        temperature: float | None = None,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.parser = ToolCallParser(tokenizer)
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        sampling = {"temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {}
        self.config = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=temperature is not None, **sampling
        )
        stops = model.generation_config.eos_token_id
        self.stops = set(stops if isinstance(stops, list) else [stops]) - {None}

    def render(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids, templated with its tools and the generation prompt.
        TrainingInputError for a template that cannot render it (one that refuses tool
        messages, or roles that do not alternate): the model cannot do such tasks."""
        tools: list[dict[Any, Any] | Callable[..., Any]] | None = (
            list(prompt.tools) if prompt.tools else None
        )
        try:
            text = self.tokenizer.apply_chat_template(
                prompt.messages, tools=tools, tokenize=False, add_generation_prompt=True
            )
        except TemplateError as error:
            raise TrainingInputError(
                "the tokenizer's chat template cannot render a conversation with tools and "
                f"tool results: {error}"
            ) from error
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def __call__(self, prompts: Sequence[Prompt]) -> list[Reply]:
        replies: list[Reply] = []
        for start in range(0, len(prompts), self.batch_size):
            replies += self._batch(prompts[start : start + self.batch_size])
        return replies

    @torch.no_grad()
    def _batch(self, prompts: Sequence[Prompt]) -> list[Reply]:
        rendered = [self.render(prompt) for prompt in prompts]
        pad = self.tokenizer.pad_token_id
        width = max(len(ids) for ids in rendered)
        input_ids = torch.full((len(rendered), width), pad, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, ids in enumerate(rendered):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[row, width - len(ids) :] = 1
        device = self.model.device
        output = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=mask.to(device),
            generation_config=self.config,
        )
        return [
            self._reply(self._trimmed(new.tolist()), ids, prompt.tools)
            for new, ids, prompt in zip(output[:, width:], rendered, prompts, strict=True)
        ]

    def _trimmed(self, ids: list[int]) -> list[int]:
        """The generated ids up to and including the first stop token (the padding after it
        dropped)."""
        for index, token in enumerate(ids):
            if token in self.stops:
                return ids[: index + 1]
        return ids

    def _reply(
        self, ids: list[int], prompt_ids: list[int], tools: list[dict[str, Any]] | None
    ) -> Reply:
        text = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        calls = self.parser.parse_ids(ids, prompt_ids, tools)
        return Reply(text, calls, len(ids), len(prompt_ids))


# --- tool-call tasks ----------------------------------------------------------------------


def prompt_of(row: Mapping[str, Any]) -> Prompt:
    """A task row's prompt: its `messages` (the prompt as one user turn without), its tools."""
    messages = json_field(row, "messages") or [{"role": "user", "content": row["prompt"]}]
    tools = json_field(row, "tools")
    return Prompt([dict(message) for message in messages], tools if tools else None)


def json_field(row: Mapping[str, Any], name: str) -> Any:
    """A row's field, decoded when the export wrote it as JSON text (`trl`'s grpo.jsonl);
    None for text that is not JSON."""
    value = row.get(name)
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return None


def score_replies(rows: Sequence[Mapping[str, Any]], replies: Sequence[Reply]) -> list[CallScores]:
    """Each tool-call row's metrics for its reply."""
    return [
        call_scores(reply.calls, json_field(row, "expected_calls") or [], json_field(row, "tools"))
        for row, reply in zip(rows, replies, strict=True)
    ]


class Policy(Protocol):
    """What generates replies: a `ChatPolicy`, or hand-written replies in a test."""

    def __call__(self, prompts: Sequence[Prompt], /) -> list[Reply]: ...


def score_tool_tasks(
    greedy: Policy, sample: Policy, rows: Sequence[Mapping[str, Any]], k: int
) -> dict[str, Scores]:
    """Per tool-call row: the three metrics of the greedy reply, its pass@1 (its call
    accuracy: the reward is 1 for a matching call set) and its pass@k (any of `k` sampled
    replies matches, the unbiased estimator with n == k). A row without a list of expected
    calls cannot be scored: it is left out, with a warning."""
    rows = [row for row in rows if _is_scorable(row)]
    prompts = [prompt_of(row) for row in rows]
    first = score_replies(rows, greedy(prompts))
    repeated_rows = [row for row in rows for _ in range(k)]
    sampled = score_replies(repeated_rows, sample([p for p in prompts for _ in range(k)]))
    metrics: dict[str, Scores] = {name: {} for name in (*TOOL_METRICS, "pass@1", "pass@k")}
    for index, (row, scores) in enumerate(zip(rows, first, strict=True)):
        item_id = row["item_id"]
        for name, value in scores.as_dict().items():
            metrics[name][item_id] = value
        metrics["pass@1"][item_id] = scores.call_accuracy
        hits = [s.call_accuracy >= 1 for s in sampled[index * k : (index + 1) * k]]
        metrics["pass@k"][item_id] = 1.0 if any(hits) else 0.0
    return metrics


def _is_scorable(row: Mapping[str, Any]) -> bool:
    if isinstance(json_field(row, "expected_calls"), list):
        return True
    print(f"warning: task {row['item_id']} has no expected calls; left out", file=sys.stderr)
    return False

"""Multi-turn environment episodes: a task's later user turns played inside TRL's tool loop.

TRL 1.16's tool loop (`GRPOTrainer._tool_call_loop`) plays one assistant turn: the model calls
tools until it answers without one. `play_episodes` runs that loop, then, for each environment
episode that answered (its last reply ends its turn and calls no tool) and has turns left
(`EnvironmentEpisode.turns_left`, up to the config's `max_turns`), appends the next user turn's
messages to the trajectory, generates the model's reply after them and runs TRL's loop again
on those episodes alone — the same parsing of tool calls (the tokenizer's response schema),
the same tool execution and rollback of results past the budget — until no episode goes on.

The token budget of an episode (`max_episode_tokens`) bounds everything after its prompt:
the model's tokens, tool results and the later user turns; TRL's loop reads it as
`max_completion_length`, which is set to it for the loop's duration (a single generation is
still capped by `max_completion_length`, the generation config's `max_new_tokens`). A user
turn that does not fit ends the episode with turns left: it is cut off, so masked out of the
loss and rewarded 0 (finetune.grpo). Tokens are concatenated, never re-tokenized: the user turn's
tokens are the chat template's rendering of it after an assistant's end of turn, as TRL
renders tool results. Tool results and user turns get `tool_mask` 0 (TRL's env mask): only the
model's tokens are trained.

Why not `rollout_func`: TRL hands a `rollout_func` the whole generation (tokenizing, generating
with transformers or vLLM, parsing, running tools) and skips its `env_mask` when tools are set,
so an environment run would have to re-implement the loop this module reuses.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from trl.chat_template_utils import parse_response

from finetune.environments import EnvironmentEpisode, begin_turn, next_turn
from finetune.errors import TrainingInputError

LoopResult = list[Any]
"""TRL's loop result: tool_mask, completions, completion_ids, logprobs, tool calls, tool
failures, tool images (one list per rollout where a list)."""
Loop = Callable[..., Sequence[Any]]


def play_episodes(
    trainer: Any,
    loop: Loop,
    prompts: list[list[dict[str, Any]]],
    prompt_ids: list[list[int]],
    *loop_args: Any,
    episode_tokens: int,
) -> tuple[Any, ...]:
    """TRL's tool loop over the batch, then each environment episode's later turns (see the
    module docstring); `loop_args` are the loop's completion_ids, completions, logprobs, images
    and multimodal fields. Returns what TRL's loop returns."""
    conversations = copy.deepcopy(prompts)  # the loop appends to the prompts it is given
    with _budget(trainer, episode_tokens):
        state: LoopResult = list(loop(prompts, prompt_ids, *loop_args))
        for _turn in range(max((_turns_left(trainer)), default=0)):
            turns = _next_turns(trainer, state, prompt_ids, episode_tokens)
            if not turns:
                break
            _play_turn(trainer, loop, turns, conversations, prompt_ids, state)
    return tuple(state)


def _turns_left(trainer: Any) -> list[int]:
    return [
        episode.turns_left
        for episode in trainer.environments or ()
        if isinstance(episode, EnvironmentEpisode)
    ]


def _next_turns(
    trainer: Any, state: LoopResult, prompt_ids: list[list[int]], budget: int
) -> dict[int, tuple[list[dict[str, Any]], list[int]]]:
    """Each episode that goes on: its row -> (the next user turn's messages, their tokens).
    An episode whose next turn does not fit the budget or the model's context stops here, with
    that turn left (so it is cut off)."""
    completions, completion_ids = state[1], state[2]
    stops = {*trainer.eos_token_ids, trainer._tokenizer.pad_token_id}
    limit = context_limit(trainer)
    turns = {}
    for row, episode in enumerate(trainer.environments or ()):
        if not isinstance(episode, EnvironmentEpisode) or not has_answered(
            completion_ids[row], completions[row], stops
        ):
            continue
        messages = next_turn(episode)
        if messages is None:
            continue
        suffix = user_turn_ids(trainer, messages)
        used = len(completion_ids[row]) + len(suffix)
        if used >= budget or len(prompt_ids[row]) + used >= limit:
            continue
        begin_turn(episode)
        turns[row] = (messages, suffix)
    return turns


def has_answered(ids: list[int], completion: list[dict[str, Any]], stops: set[int]) -> bool:
    """Whether a trajectory's last reply ended its turn (an end-of-turn token) calling no tool.

    >>> has_answered([4, 2], [{"role": "assistant", "content": "Done."}], {2})
    True
    >>> has_answered([4, 2], [{"role": "assistant", "tool_calls": [{}]}], {2})
    False
    >>> has_answered([4, 5], [{"role": "assistant", "content": "Do"}], {2})
    False
    """
    last = completion[-1] if completion else None
    return bool(ids) and ids[-1] in stops and isinstance(last, dict) and not last.get("tool_calls")


def _play_turn(
    trainer: Any,
    loop: Loop,
    turns: dict[int, tuple[list[dict[str, Any]], list[int]]],
    conversations: list[list[dict[str, Any]]],
    prompt_ids: list[list[int]],
    state: LoopResult,
) -> None:
    """One more user turn for the episodes in `turns`: the reply after it, then TRL's loop on
    those episodes alone; the results merged into `state` (the user turn's tokens masked)."""
    tool_mask, completions, completion_ids, logprobs = state[:4]
    rows = list(turns)
    contexts = [prompt_ids[row] + completion_ids[row] + turns[row][1] for row in rows]
    replies, reply_logprobs = trainer._generate_single_turn(contexts, None, {}, num_generations=1)
    budget = trainer.max_completion_length
    for index, row in enumerate(rows):  # a reply past the budget is cut to it
        room = max(0, budget - (len(contexts[index]) - len(prompt_ids[row])))
        replies[index] = replies[index][:room]
        if logprobs is not None:
            reply_logprobs[index] = reply_logprobs[index][:room]
    for row in rows:
        completions[row].extend(copy.deepcopy(turns[row][0]))
    parsed = [
        _parsed(trainer, ids, contexts[index], rows[index]) for index, ids in enumerate(replies)
    ]
    sub_ids = [
        contexts[index][len(prompt_ids[row]) :] + replies[index] for index, row in enumerate(rows)
    ]
    sub_logprobs = None
    if logprobs is not None:
        sub_logprobs = [
            logprobs[row] + [0.0] * len(turns[row][1]) + list(reply_logprobs[index])
            for index, row in enumerate(rows)
        ]
    sub_prompts = [conversations[row] + copy.deepcopy(completions[row]) for row in rows]
    sub_prompt_ids = [prompt_ids[row] for row in rows]
    with _only_rows(trainer, rows):
        sub = loop(sub_prompts, sub_prompt_ids, sub_ids, [[one] for one in parsed], sub_logprobs,
                   None, {})  # fmt: skip
    for index, row in enumerate(rows):
        known = len(completion_ids[row]) + len(turns[row][1])
        tool_mask[row] = tool_mask[row] + [0] * len(turns[row][1]) + sub[0][index][known:]
        completions[row].extend(message for message in sub[1][index] if message)
        completion_ids[row] = sub[2][index]
        if logprobs is not None:
            logprobs[row] = sub[3][index]
    state[4] += sub[4]
    state[5] += sub[5]


def _parsed(trainer: Any, ids: list[int], context: list[int], row: int) -> dict[str, Any]:
    if not ids:
        return {}
    tools = trainer._env_tools[trainer._batch_environments[row]]
    reply: dict[str, Any] = parse_response(trainer._tokenizer, ids, prefix=context, tools=tools)
    return reply


@contextlib.contextmanager
def _budget(trainer: Any, tokens: int) -> Iterator[None]:
    """TRL's loop reads its budget from `max_completion_length`: the episode's, meanwhile."""
    kept = trainer.max_completion_length
    trainer.max_completion_length = tokens
    try:
        yield
    finally:
        trainer.max_completion_length = kept


@contextlib.contextmanager
def _only_rows(trainer: Any, rows: list[int]) -> Iterator[None]:
    """The trainer's per-rollout tool state narrowed to `rows`, for a loop over them alone."""
    names = ("_sync_tool_dicts", "_async_tool_dicts", "_batch_environments")
    kept = {name: getattr(trainer, name) for name in names}
    for name, values in kept.items():
        setattr(trainer, name, [values[row] for row in rows])
    try:
        yield
    finally:
        for name, values in kept.items():
            setattr(trainer, name, values)


def context_limit(trainer: Any) -> int:
    """The longest sequence the generation backend takes (as TRL's loop reads it)."""
    if trainer.use_vllm and trainer.vllm_mode == "colocate":
        return int(trainer.vllm_generation.llm.llm_engine.model_config.max_model_len)
    config = trainer.model.config
    config = config.text_config if trainer._is_vlm else config
    return int(config.max_position_embeddings)


def user_turn_ids(trainer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """The tokens of a user turn after an assistant's end of turn, with the generation prompt:
    the chat template's rendering of `messages` after a dummy exchange, from the end-of-turn
    token that closes the dummy assistant turn (as TRL's `_get_tool_suffix_ids` cuts tool
    results). Counted in end-of-turn tokens, not as a prefix, because some templates (Qwen 3)
    render the last assistant turn differently (an empty think block) until a user turn
    follows it."""
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "dummy"}]

    def render(conversation: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        ids: list[int] = trainer.processing_class.apply_chat_template(
            conversation,
            add_generation_prompt=generation_prompt,
            tokenize=True,
            chat_template=trainer.chat_template,
            return_dict=False,
            **trainer.chat_template_kwargs,
        )
        return ids

    prefix, full = render(dummy, False), render(dummy + messages, True)
    eos = trainer._tokenizer.eos_token_id
    ends = [index for index, token in enumerate(full) if token == eos]
    turns = prefix.count(eos)  # the dummy exchange's ends of turn, the assistant's the last
    counted = 0 < turns <= len(ends)
    start = ends[turns - 1] + 1 if counted else len(prefix)
    suffix = full[start:]
    shown = trainer._tokenizer.decode(suffix)
    if not (counted or full[:start] == prefix) or not all(m["content"] in shown for m in messages):
        raise TrainingInputError(
            "the chat template does not render a user turn after an assistant's end of turn "
            "as tokens that follow it, so a later user turn cannot be appended to an episode"
        )
    return suffix

"""Environment tasks at evaluation: a policy's episodes in each task's sandboxed environment.

    run_episodes(policy, rows, EpisodeLimits(), wave=16) -> [EpisodeResult, ...]

One episode of an environment row (`task_kind == "environment"`, its `environment` spec as
`flywheel.sandbox.environment` reads it):

1. the environment starts in a sandboxed process of its own (`open_environment(spec)`);
2. the policy sees the row's prompt (its `messages`, else its `prompt` as one user turn: the
   spec's first turn) and its `tools` (without any, the environment's tool names with empty
   schemas); its reply's calls are read as `finetune.tool_eval.ChatPolicy` reads them;
3. a reply with calls is appended as an assistant message with `tool_calls`, each call goes to
   `session.call` in order and its answer is appended as a `tool` message; then the policy
   replies again. Arguments that do not parse (malformed JSON) are answered by one tool
   message "Error: malformed tool call: ...", an unknown function or bad arguments by the
   environment's "Error: ..." — the episode goes on, and its final state decides;
4. a reply without calls ends the user's turn: the spec's next turn (`turns[1:]`, in order)
   is appended as user messages and the policy replies again; after the last turn the
   episode is `finished`;
5. the episode also stops after `max_generations` replies (`generations`), once the
   conversation reaches `max_tokens` tokens (`tokens`), once `max_tool_calls` calls are made
   (or the spec's own `max_steps`, which the session enforces: `tool_calls`), or when the
   environment ends early (`environment: <why>`: its budget, a loop, an exit);
6. success: `final_state_reward(spec, session.state())` — 1.0 when the environment's state is
   the one its ground-truth calls produce — whatever stopped it; 0.0 for an environment that
   ended early or never started (an invalid spec: `invalid: <why>`).

Episodes of a wave run in lockstep: each round, one batched generation for every episode
still going, so `wave` environments are open at once (a sandboxed process each). Nothing an
episode's model or environment does raises here; only a missing sandbox does
(SandboxUnavailable, which `finetune.canaries.preflight_sandbox` refuses before any model
loads).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from finetune.tool_eval import Message, Policy, Prompt, Reply, Scores, json_field, prompt_of
from flywheel.errors import EnvironmentFailed, InvalidInput
from flywheel.sandbox.environment import EnvironmentSession, final_state_reward, open_environment

ENVIRONMENT_METRICS = ("environment_success",)
EPISODE_LOSSES = ("turns_used", "tool_calls", "tool_errors")
"""Per-episode counts, reported with the losses: never gated (more turns is not worse per se)."""


UNOFFERED = "Error: {} is not one of the tools offered"


@dataclass(frozen=True)
class EpisodeLimits:
    """How long one episode may run: model replies, conversation tokens, tool calls."""

    max_generations: int = 16
    max_tokens: int = 4096
    max_tool_calls: int = 32


@dataclass(frozen=True)
class EpisodeResult:
    item_id: str
    success: float
    turns_used: int
    """Model replies in the episode (every generation: tool-calling and answering ones)."""
    tool_calls: int
    """Calls sent to the environment (malformed ones excluded)."""
    tool_errors: int
    """Tool messages that were errors: malformed calls, unknown functions, exceptions."""
    ended: str
    """Why it stopped: finished, generations, tokens, tool_calls, environment: ..., invalid: ..."""
    messages: list[Message] = field(default_factory=list, repr=False)


class _Episode:
    """One episode's conversation and environment, advanced one reply at a time."""

    def __init__(self, row: Mapping[str, Any], limits: EpisodeLimits) -> None:
        self.row, self.limits = row, limits
        self.spec: Any = json_field(row, "environment")
        prompt = prompt_of(row)
        self.messages, self.tools = prompt.messages, prompt.tools
        self.later_turns: list[list[Message]] = []
        self.session: EnvironmentSession | None = None
        self.replies = self.calls = self.errors = 0
        self.ended: str | None = None
        try:
            self.later_turns = _later_turns(self.spec)
            self.session = open_environment(self.spec)
        except InvalidInput as error:
            self.ended = f"invalid: {error}"
            return
        if self.session.ended is not None:
            self.ended = f"environment: {self.session.ended}"
        elif not self.tools:
            self.tools = [_bare_tool(name) for name in self.session.tool_names]

    def prompt(self) -> Prompt:
        return Prompt(self.messages, self.tools)

    def take(self, reply: Reply) -> None:
        """Append the reply (and its tools' answers, or the next turn); say when it is over."""
        self.replies += 1
        if reply.calls.error is not None:
            self.messages.append({"role": "assistant", "content": reply.text})
            self._tool_message("", f"Error: {reply.calls.error}", is_error=True)
        elif reply.calls.calls:
            self._run_calls(reply.calls.calls)
        else:
            self.messages.append({"role": "assistant", "content": reply.text})
            if not self.later_turns:
                self.ended = "finished"
            else:
                self.messages += self.later_turns.pop(0)
        self._check_limits(reply)

    def _run_calls(self, calls: Sequence[Mapping[str, Any]]) -> None:
        assert self.session is not None
        self.messages.append(
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls
            ]}
        )  # fmt: skip
        for call in calls:
            if self.calls >= self._call_budget():
                self.ended = "tool_calls"
                return
            if call["name"] not in self._offered():
                # the environment has other public methods; only the offered tools are tools
                self.calls += 1
                self._tool_message(call["name"], UNOFFERED.format(call["name"]), is_error=True)
                continue
            result = self.session.call(call["name"], call["arguments"])
            self.calls += 1
            self._tool_message(call["name"], result.content, is_error=result.is_error)
        if self.session.ended is not None:
            self.ended = f"environment: {self.session.ended}"

    def _offered(self) -> set[str]:
        return {str(tool.get("function", tool).get("name")) for tool in self.tools or ()}

    def _tool_message(self, name: str, content: str, *, is_error: bool) -> None:
        self.errors += 1 if is_error else 0
        self.messages.append({"role": "tool", "name": name, "content": content})

    def _check_limits(self, reply: Reply) -> None:
        if self.ended is not None:
            return
        if self.replies >= self.limits.max_generations:
            self.ended = "generations"
        elif reply.prompt_tokens + reply.tokens >= self.limits.max_tokens:
            self.ended = "tokens"
        elif self.calls >= self._call_budget():
            self.ended = "tool_calls"

    def _call_budget(self) -> int:
        steps = self.spec.get("max_steps")
        budget = self.limits.max_tool_calls
        return min(budget, steps) if isinstance(steps, int) and steps > 0 else budget

    def finish(self) -> EpisodeResult:
        """The episode's result; its environment closed."""
        state = None
        if self.session is not None:
            try:
                state = self.session.state()
            except EnvironmentFailed as error:
                self.ended = self.ended or f"environment: {error}"
            finally:
                self.session.close()
        success = final_state_reward(self.spec, state) if state is not None else 0.0
        return EpisodeResult(
            self.row["item_id"],
            success,
            self.replies,
            self.calls,
            self.errors,
            self.ended or "unfinished",
            self.messages,
        )


def _later_turns(spec: Any) -> list[list[Message]]:
    """The user messages of the spec's turns after the first (the prompt holds that one)."""
    if not isinstance(spec, Mapping):
        raise InvalidInput("the task has no environment spec (an object)")
    turns = spec.get("turns") or []
    if not isinstance(turns, list) or not all(
        isinstance(turn, list) and all(isinstance(m, Mapping) for m in turn) for turn in turns
    ):
        raise InvalidInput("an environment spec's turns must be lists of messages")
    return [[dict(message) for message in turn] for turn in turns[1:]]


def _bare_tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": "",
            "parameters": {"type": "object", "properties": {}}}}  # fmt: skip


def run_episodes(
    policy: Policy, rows: Sequence[Mapping[str, Any]], limits: EpisodeLimits, *, wave: int = 16
) -> list[EpisodeResult]:
    """One episode per row, `wave` at a time in lockstep, in the rows' order."""
    results: list[EpisodeResult] = []
    for start in range(0, len(rows), wave):
        episodes: list[_Episode] = []
        try:
            episodes = [_Episode(row, limits) for row in rows[start : start + wave]]
            active = [episode for episode in episodes if episode.ended is None]
            while active:
                replies = policy([episode.prompt() for episode in active])
                for episode, reply in zip(active, replies, strict=True):
                    episode.take(reply)
                active = [episode for episode in episodes if episode.ended is None]
        finally:
            results += [episode.finish() for episode in episodes]
        ended = Counter(result.ended.split(":")[0] for result in results)
        print(
            f"evaluate: episodes {len(results)}/{len(rows)} "
            f"({', '.join(f'{why} {n}' for why, n in sorted(ended.items()))})",
            file=sys.stderr,
            flush=True,
        )
    return results


def score_environment_tasks(
    greedy: Policy,
    sample: Policy,
    rows: Sequence[Mapping[str, Any]],
    k: int,
    limits: EpisodeLimits,
    *,
    wave: int = 16,
) -> tuple[dict[str, Scores], dict[str, Scores]]:
    """(metrics, losses) per environment row: `environment_success` and pass@1 of its greedy
    episode, pass@k (any of `k` sampled episodes succeeds); the greedy episode's
    `turns_used`, `tool_calls` and `tool_errors` as losses."""
    first = run_episodes(greedy, rows, limits, wave=wave)
    repeated = [row for row in rows for _ in range(k)]
    sampled = run_episodes(sample, repeated, limits, wave=wave) if k else []
    metrics: dict[str, Scores] = {"environment_success": {}, "pass@1": {}, "pass@k": {}}
    losses: dict[str, Scores] = {name: {} for name in EPISODE_LOSSES}
    for index, result in enumerate(first):
        item_id = result.item_id
        metrics["environment_success"][item_id] = metrics["pass@1"][item_id] = result.success
        hits = [other.success >= 1 for other in sampled[index * k : (index + 1) * k]]
        metrics["pass@k"][item_id] = 1.0 if any(hits) else 0.0
        losses["turns_used"][item_id] = float(result.turns_used)
        losses["tool_calls"][item_id] = float(result.tool_calls)
        losses["tool_errors"][item_id] = float(result.tool_errors)
    return metrics, losses

"""finetune.multiturn: an environment episode's later user turns, played inside TRL's own tool
loop (`GRPOTrainer._tool_call_loop`, run here on a stand-in trainer whose generation is
scripted), with the Qwen 2.5 chat template and TRL's response schema parsing the calls:
turns appended, the env mask over tool results and user turns, the token budget, and
environments that raise or end the episode scored 0 with a reason, never a crash."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from trl.chat_template_utils import add_response_schema, parse_response
from trl.trainer.grpo_trainer import GRPOTrainer

from finetune import tiny
from finetune.config import load_config
from finetune.environments import EnvironmentEpisode, environment_class
from finetune.errors import TrainingInputError
from finetune.grpo import is_cut_off
from finetune.multiturn import play_episodes, user_turn_ids
from flywheel.errors import EnvironmentFailed
from tests.finetune.agent_fixtures import PROMPT, SPEC, TOOLS, FakeBackend, FakeResult, FakeSession

pytestmark = pytest.mark.no_database


def call(folder: str) -> str:
    return f'<tool_call>\n{{"name": "cd", "arguments": {{"folder": "{folder}"}}}}\n</tool_call>'


END = "<|im_end|>"
REPLIES = {  # what the scripted model says after ...
    "Back up.": call(".."),  # the second user turn
    "</tool_response>": "Done.",  # a tool result
}
FIRST = call("docs")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    family = tiny.FAMILIES["qwen2_5"]
    probe = tiny.build_family_tokenizer(family, ["x"], vocab_size=300)
    conversation = [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": FIRST + "Done."},
        {"role": "user", "content": "Back up."},
    ]
    text = probe.apply_chat_template(conversation, tools=TOOLS, tokenize=False)
    built = tiny.build_family_tokenizer(family, [text] * 4, vocab_size=600)
    add_response_schema(built)
    return built


class StandIn:
    """What TRL's tool loop reads of a GRPOTrainer, with a scripted model: after a context
    that ends with one of REPLIES' keys (and the generation prompt) it answers that reply."""

    _tool_call_loop = GRPOTrainer._tool_call_loop
    _get_tool_suffix_ids = GRPOTrainer._get_tool_suffix_ids

    def __init__(self, tokenizer: Any, episodes: list[EnvironmentEpisode], budget: int) -> None:
        self.processing_class = self._tokenizer = tokenizer
        self.chat_template, self.chat_template_kwargs = None, {}
        self._is_vlm, self.use_vllm, self.vllm_mode, self.tools = False, False, "colocate", TOOLS
        self.model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=4096))
        self.max_completion_length, self.max_tool_calling_iterations = budget, 4
        self.eos_token_ids = [tokenizer.eos_token_id]
        self.environments = episodes
        self.environment_factories = {"GorillaFileSystem": type(episodes[0])}
        self._env_tools = {"GorillaFileSystem": TOOLS}
        self._batch_environments = ["GorillaFileSystem"] * len(episodes)
        self._sync_tool_dicts = [{"cd": episode.cd} for episode in episodes]  # type: ignore[attr-defined]
        self._async_tool_dicts = [{} for _ in episodes]
        self.generations: list[str] = []

    def _generate_single_turn(
        self, prompt_ids: list[list[int]], *_args: Any, **_kwargs: Any
    ) -> tuple[list[list[int]], list[list[float]]]:
        replies = []
        for ids in prompt_ids:
            context = self._tokenizer.decode(ids).removesuffix("<|im_start|>assistant\n")
            said = next(text for key, text in REPLIES.items() if context.endswith(key + END + "\n"))
            self.generations.append(said)
            replies.append(self.encode(said + END))
        return replies, [[-0.5] * len(ids) for ids in replies]

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False)
        return ids


def episodes(max_turns: int, backend: Any = FakeBackend, spec: Any = SPEC) -> list[Any]:
    episode_class = environment_class(
        "GorillaFileSystem", TOOLS, backend=backend, max_turns=max_turns
    )
    batch = [episode_class() for _ in range(2)]
    for episode in batch:
        episode.reset(environment_spec=spec)
    return batch


def rollout(trainer: StandIn, budget: int | None = None) -> dict[str, Any]:
    """The first reply (the call) as TRL's `_generate` leaves it, then `play_episodes`."""
    rows = len(trainer.environments)
    prompt = [{"role": "user", "content": PROMPT}]
    prompt_ids = trainer._tokenizer.apply_chat_template(
        prompt, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    first = trainer.encode(FIRST + END)
    parsed = parse_response(trainer._tokenizer, first, prefix=prompt_ids, tools=TOOLS)
    out = play_episodes(
        trainer,
        trainer._tool_call_loop,
        [copy.deepcopy(prompt) for _ in range(rows)],
        [list(prompt_ids) for _ in range(rows)],
        [list(first) for _ in range(rows)],
        [[copy.deepcopy(parsed)] for _ in range(rows)],
        [[-0.5] * len(first) for _ in range(rows)],
        None,
        {},
        episode_tokens=budget or trainer.max_completion_length,
    )
    names = ("tool_mask", "completions", "completion_ids", "logprobs", "calls", "failures")
    return dict(zip(names, out, strict=False))


@pytest.fixture(autouse=True)
def _sessions() -> Any:
    FakeSession.opened.clear()
    yield
    FakeSession.opened.clear()


def test_the_next_user_turn_is_appended_and_only_the_models_tokens_are_trained(
    tokenizer: Any,
) -> None:
    trainer = StandIn(tokenizer, episodes(max_turns=2), budget=512)

    out = rollout(trainer)
    rewards = [episode.get_reward() for episode in trainer.environments]

    said = [FIRST, "Done.", call(".."), "Done."]
    for row in range(2):
        roles = [message["role"] for message in out["completions"][row]]
        assert roles == ["assistant", "tool", "assistant", "user", "assistant", "tool", "assistant"]
        assert out["completions"][row][3]["content"] == "Back up."
        assert [m["content"] for m in out["completions"][row] if m["role"] == "tool"] == [
            "ok: /docs",
            "ok: /docs/..",
        ]
        ids, mask = out["completion_ids"][row], out["tool_mask"][row]
        assert len(mask) == len(ids) == len(out["logprobs"][row])
        trained = tokenizer.decode([token for token, m in zip(ids, mask, strict=True) if m])
        masked = tokenizer.decode([token for token, m in zip(ids, mask, strict=True) if not m])
        assert trained == END.join(said) + END  # every model token, and nothing else
        assert "Back up." in masked
        assert "ok: /docs/.." in masked
        assert [lp for lp, m in zip(out["logprobs"][row], mask, strict=True) if not m] == [
            0.0
        ] * mask.count(0)
    assert out["calls"] == 4
    assert [session.calls for session in FakeSession.opened] == [
        [("cd", {"folder": "docs"}), ("cd", {"folder": ".."})]
    ] * 2
    assert rewards == [1.0, 1.0]  # the two turns' ground truth: /docs then ..


def test_one_turn_plays_trls_loop_unchanged(tokenizer: Any) -> None:
    trainer = StandIn(tokenizer, episodes(max_turns=1), budget=512)

    out = rollout(trainer)

    for row in range(2):
        assert [m["role"] for m in out["completions"][row]] == ["assistant", "tool", "assistant"]
        assert out["tool_mask"][row].count(0) == len(trainer._get_tool_suffix_ids(
            [{"role": "tool", "name": "cd", "content": "ok: /docs"}]))  # fmt: skip
    assert trainer.generations == ["Done.", "Done."]
    assert [episode.get_reward() for episode in trainer.environments] == [1.0, 1.0]


def first_turn_length(trainer: StandIn) -> int:
    tool = trainer._get_tool_suffix_ids([{"role": "tool", "name": "cd", "content": "ok: /docs"}])
    return len(trainer.encode(FIRST + END)) + len(tool) + len(trainer.encode("Done." + END))


def test_an_episode_whose_next_turn_does_not_fit_the_budget_stops_and_scores_zero(
    tokenizer: Any,
) -> None:
    trainer = StandIn(tokenizer, episodes(max_turns=2), budget=512)
    budget = first_turn_length(trainer) + 2  # the user turn is longer than 2 tokens

    out = rollout(trainer, budget)
    episode = trainer.environments[0]
    reward = episode.get_reward()

    assert [m["role"] for m in out["completions"][0]] == ["assistant", "tool", "assistant"]
    assert len(out["completion_ids"][0]) <= budget
    assert (reward, episode.turns_left) == (0.0, 1)
    assert "cut off by the token or round budget (at turn 1 of 2)" in str(episode.zero_reason)
    assert trainer.max_completion_length == 512  # the episode budget was the loop's only


def test_a_reply_past_the_budget_is_cut_to_it_and_counts_as_cut_off(tokenizer: Any) -> None:
    trainer = StandIn(tokenizer, episodes(max_turns=2), budget=512)
    user = user_turn_ids(trainer, [{"role": "user", "content": "Back up."}])
    budget = first_turn_length(trainer) + len(user) + 3  # three tokens of the second call

    out = rollout(trainer, budget)
    ids = out["completion_ids"][0]

    assert len(ids) == budget
    assert [m["role"] for m in out["completions"][0]][-2:] == ["user", "assistant"]
    stops = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    assert is_cut_off(ids, out["completions"][0], stops)  # so the trainer masks it, scores 0
    assert [session.calls for session in FakeSession.opened] == [[("cd", {"folder": "docs"})]] * 2


class EndingSession(FakeSession):
    """A session whose environment loops on `cd("..")`: the sandbox ends the episode."""

    def call(self, name: str, arguments: Mapping[str, Any]) -> FakeResult:
        if arguments.get("folder") == "..":
            self.ended = "timeout: the call ran past 5.0 s"
        if getattr(self, "ended", None):
            return FakeResult(f"Error: the environment has ended ({self.ended})", True)
        return super().call(name, arguments)

    def state(self) -> dict[str, dict[str, Any]]:
        if getattr(self, "ended", None):
            raise EnvironmentFailed(f"the episode ended: {self.ended}")
        return super().state()


class RaisingSession(FakeSession):
    """A session whose call raises (a bug in the session, not the environment's answer)."""

    def call(self, name: str, arguments: Mapping[str, Any]) -> FakeResult:
        if arguments.get("folder") == "..":
            raise RuntimeError("the session broke")
        return super().call(name, arguments)


def backend_of(session: type[FakeSession]) -> Any:
    class Backend(FakeBackend):
        @staticmethod
        def open_environment(spec: Mapping[str, Any]) -> FakeSession:
            return session(spec)

    return Backend


@pytest.mark.parametrize(
    ("session", "tool_says", "why"),
    [
        (EndingSession, "Error: the environment has ended (timeout", "the episode ended early"),
        (RaisingSession, "{'error': 'the session broke'}", "the final state is not"),
    ],
)
def test_an_environment_that_loops_or_raises_scores_zero_with_its_reason(
    tokenizer: Any, session: type[FakeSession], tool_says: str, why: str
) -> None:
    trainer = StandIn(tokenizer, episodes(max_turns=2, backend=backend_of(session)), budget=512)

    out = rollout(trainer)
    episode = trainer.environments[0]
    reward = episode.get_reward()

    assert [m["role"] for m in out["completions"][0]][-3:] == ["assistant", "tool", "assistant"]
    assert str(out["completions"][0][-2]["content"]).startswith(tool_says)
    assert reward == 0.0
    assert str(episode.zero_reason).startswith(why)


def test_a_later_turn_that_is_no_chat_ends_the_episode_cut_off(tokenizer: Any) -> None:
    spec = {**SPEC, "turns": [SPEC["turns"][0], [{"role": "user", "content": 7}]]}
    trainer = StandIn(tokenizer, episodes(max_turns=2, spec=spec), budget=512)

    out = rollout(trainer)
    episode = trainer.environments[0]

    assert [m["role"] for m in out["completions"][0]] == ["assistant", "tool", "assistant"]
    assert (episode.get_reward(), episode.turns_left) == (0.0, 1)


def test_the_config_plays_one_turn_by_default_within_max_completion_length() -> None:
    default = load_config("grpo", None, [])
    multi = load_config("grpo", None, ["max_turns=3", "max_episode_tokens=4096"])

    assert (default.max_turns, default.max_episode_tokens) == (1, None)
    assert default.episode_tokens == default.max_completion_length
    assert (multi.max_turns, multi.episode_tokens) == (3, 4096)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["max_turns=0"], "max_turns"),
        (["max_episode_tokens=100", "max_completion_length=256"], "must be at least"),
    ],
)
def test_impossible_turn_settings_are_one_line_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(TrainingInputError, match="config") as raised:
        load_config("grpo", None, overrides)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("name", sorted(tiny.FAMILIES))
def test_a_user_turn_renders_after_an_assistants_end_of_turn_in_each_family(name: str) -> None:
    """Qwen 3 renders the last assistant turn with an empty think block until a user turn
    follows: the user turn's tokens are cut at the assistant's end of turn, not as a prefix.
    Phi-3's template ends a conversation with its eos, which no user turn follows (its template
    shows no tools either, so such a run is refused before training)."""
    tokenizer = tiny.build_family_tokenizer(tiny.FAMILIES[name], ["Back up. dummy"] * 4, 400)
    stand_in = SimpleNamespace(
        processing_class=tokenizer,
        _tokenizer=tokenizer,
        chat_template=None,
        chat_template_kwargs={},
    )
    turn = [{"role": "user", "content": "Back up."}]
    if name == "phi3":
        with pytest.raises(TrainingInputError, match="cannot be appended"):
            user_turn_ids(stand_in, turn)
        return
    ids = user_turn_ids(stand_in, turn)
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "dummy"}]
    full = tokenizer.apply_chat_template(
        dummy + turn, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    shown = tokenizer.decode(ids)

    assert full[-len(ids) :] == ids
    assert "Back up." in shown
    assert "dummy" not in shown
    assert tokenizer.eos_token_id not in ids[:1]  # starts after the assistant's end of turn

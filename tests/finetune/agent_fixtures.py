"""A tiny file-system environment, an honest in-process fake of its sandboxed session, and a
tiny Qwen 2.5 base that has memorised one tool-calling episode in it (so a GRPO step really
calls the tool), shared by the environment and tool-training tests."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from finetune import tiny
from flywheel.datasets.export_records import TaskRecord

SOURCE = """
class GorillaFileSystem:
    def __init__(self):
        self.cwd = "/"

    def _load_scenario(self, config):
        self.cwd = config.get("cwd", "/")

    def cd(self, folder):
        self.cwd = self.cwd.rstrip("/") + "/" + folder
        return "ok: " + self.cwd
"""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "cd",
            "description": "Change the working directory.",
            "parameters": {
                "type": "object",
                "properties": {"folder": {"type": "string", "description": "The folder to enter."}},
                "required": ["folder"],
            },
        },
    }
]
PROMPT = "Go to the docs folder."
CALL = {"name": "cd", "arguments": {"folder": "docs"}}
SPEC: dict[str, Any] = {
    "source": SOURCE,
    "classes": {"GorillaFileSystem": {"cwd": "/"}},
    "turns": [[{"role": "user", "content": PROMPT}], [{"role": "user", "content": "Back up."}]],
    "ground_truth": [[CALL], [{"name": "cd", "arguments": {"folder": ".."}}]],
}


@dataclass(frozen=True)
class FakeResult:
    content: str
    is_error: bool = False


class FakeSession:
    """flywheel.sandbox.environment's EnvironmentSession API, in process: the spec's classes
    instantiated here (test code only: the real one runs them in a sandbox)."""

    opened: ClassVar[list[FakeSession]] = []  # every session, for the tests to inspect

    def __init__(self, spec: Mapping[str, Any]) -> None:
        namespace: dict[str, Any] = {}
        exec(spec["source"], namespace)
        self.instances = {}
        for name, config in spec["classes"].items():
            instance = namespace[name]()
            instance._load_scenario(copy.deepcopy(config))
            self.instances[name] = instance
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.is_closed = False
        FakeSession.opened.append(self)

    def call(self, name: str, arguments: Mapping[str, Any]) -> FakeResult:
        self.calls.append((name, dict(arguments)))
        owner = next((obj for obj in self.instances.values() if hasattr(obj, name)), None)
        if owner is None or name.startswith("_"):
            return FakeResult(f"Error: unknown function {name!r}", True)
        try:
            value = getattr(owner, name)(**arguments)
        except Exception as error:
            return FakeResult(f"Error: {type(error).__name__}: {error}", True)
        return FakeResult(value if isinstance(value, str) else json.dumps(value))

    def state(self) -> dict[str, dict[str, Any]]:
        return {
            name: {key: value for key, value in vars(obj).items() if not key.startswith("_")}
            for name, obj in self.instances.items()
        }

    def close(self) -> None:
        self.is_closed = True


class FakeBackend:
    """open_environment / final_state_reward over FakeSession."""

    @staticmethod
    def open_environment(spec: Mapping[str, Any]) -> FakeSession:
        return FakeSession(spec)

    @staticmethod
    def ground_truth_state(spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        truth = FakeSession(spec)
        FakeSession.opened.remove(truth)
        for turn in spec["ground_truth"]:
            for call in turn:
                truth.call(call["name"], call["arguments"])
        return truth.state()

    @staticmethod
    def final_state_reward(spec: Mapping[str, Any], state: Mapping[str, Any]) -> float:
        return 1.0 if dict(state) == FakeBackend.ground_truth_state(spec) else 0.0


def episode_messages() -> list[dict[str, Any]]:
    """The episode the base memorises: the call, the fake's answer, a closing reply."""
    result = FakeSession(SPEC).call(CALL["name"], CALL["arguments"]).content
    FakeSession.opened.clear()
    return [
        {"role": "user", "content": PROMPT},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": CALL}],
        },
        {"role": "tool", "name": "cd", "content": result},
        {"role": "assistant", "content": "Done."},
    ]


def save_tool_base(directory: Path) -> Path:
    """A tiny Qwen 2.5 that writes `episode_messages()`'s assistant turns after its prompt."""
    family = tiny.FAMILIES["qwen2_5"]
    probe = tiny.build_family_tokenizer(family, ["x"], vocab_size=300)
    exported = json.loads(json.dumps(TOOLS, sort_keys=True))  # as the export writes them
    text = probe.apply_chat_template(episode_messages(), tools=exported, tokenize=False)
    tokenizer = tiny.build_family_tokenizer(family, [text] * 4, vocab_size=1200)
    model = tiny.build_family_model(family, tokenizer, hidden_size=64, max_position_embeddings=1024)
    tiny.pretrain(model, tokenizer, [text], steps=120, batch_size=4, learning_rate=3e-3)
    tiny.save_base(directory, model, tokenizer)
    return directory


def task_record(kind: str, **fields: Any) -> TaskRecord:
    item_id = str(uuid.uuid4())
    return TaskRecord(
        prompt=fields.pop("prompt", PROMPT),
        entry_point=None,
        hidden_tests=None,
        visible_tests=None,
        reference_solution=None,
        task_kind=kind,
        answer=fields.pop("answer", None),
        difficulty=None,
        group_key=item_id,
        item_id=item_id,
        **fields,
    )

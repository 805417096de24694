"""The demo's tool domain, defined once: a tiny order desk the model must act on through a tool.

A user asks "Cancel the lamp order." or "Please cancel my rug order."; the assistant must call
`cancel_order(item="lamp")` in the order desk's environment and then answer from its result.
An episode succeeds when the desk's final state is the one the ground-truth call reaches: that
order, and only it, cancelled.

Two kinds of conversation, over the same two tools:

- *lookups* ("Where is my lamp order?" -> `lookup_order(item="lamp")`, then "Done: the lamp
  order is open."): the stand-in for what a real base model already knows (it has seen tool
  calls, names the item asked about in one and answers from the result). The tiny base is
  pretrained on them; a lookup changes no state, so it is never a task;
- *cancellations*: the tasks (for GRPO and held-out evaluation), and a few of them as complete
  episodes (call, tool result, answer): the SFT demonstrations of the new tool.

Held out are the orders of half the items (every other one in ITEMS): the base has looked each
of them up, no later stage sees them cancelled. The base cannot pass by what it knows (a lookup
changes nothing), nor a later model by cancelling an order it was not asked about.

What the tiny model does not learn, measured (2026-12-06, seed 0, this desk with a refund tool
added): LoRA on a few demonstrations does not teach it to choose between two new tools by the
request (cancel or refund by the verb: the new tool's name at 30% either way, always one of
them greedily) nor by a tool's result (cancel an open order, refund a shipped one: after GRPO
18 of 18 shipped orders right, 0 of 18 open ones), so a domain asking for that would show a
lift that is a guess. One new tool is what it learns here.

A closed set of items rather than order ids of digits: the tiny model does not learn to copy
digits at this size. Standard library only: `finetune` never imports this module (it renders
the conversations the demo writes); the demo, the tests and the calibration share it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

CLASS_NAME = "OrderDesk"
SOURCE = '''
class OrderDesk:
    """A tiny order desk: each order (named by its item) and its status."""

    def __init__(self):
        self.orders = {}

    def _load_scenario(self, config):
        self.orders = dict(config.get("orders", {}))

    def _order(self, item):
        if item not in self.orders:
            raise KeyError(f"no {item} order")
        return item

    def lookup_order(self, item):
        key = self._order(item)
        return f"the {key} order is {self.orders[key]}"

    def cancel_order(self, item):
        key = self._order(item)
        self.orders[key] = "cancelled"
        return f"the {key} order is cancelled"
'''


def _tool(name: str, description: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "string"}},
                "required": ["item"],
            },
        },
    }


TOOLS = [
    _tool("lookup_order", "Look up an order's status."),
    _tool("cancel_order", "Cancel an order."),
]
ITEMS = ("lamp", "desk", "chair", "sofa", "rug", "clock", "vase", "shelf", "mirror", "bench",
         "stool", "table", "bed", "fan", "mat", "oven", "radio", "tent")  # fmt: skip
PHRASES = {
    "lookup": ("What is the status of the {item} order?", "Where is my {item} order?",
               "Check the {item} order.", "Has my {item} order shipped?",
               "Look up the {item} order, please.", "I want to know about my {item} order."),
    "cancel": ("Cancel the {item} order.", "Please cancel my {item} order.",
               "I want to cancel the {item} order.", "Cancel my {item} order, please."),
}  # fmt: skip
TOOL_OF = {"lookup": "lookup_order", "cancel": "cancel_order"}
STATUSES = ("open", "shipped")
USES = ("held_out", "train", "demo", "lookup")


@dataclass(frozen=True)
class Request:
    """One user request (`lookup` or `cancel`) about the order of one item, in one of the
    kind's phrasings; the desk holds two other orders as well (the state check sees that they
    are left alone)."""

    kind: str
    item: str
    phrasing: int

    @property
    def prompt(self) -> str:
        return PHRASES[self.kind][self.phrasing].format(item=self.item)

    @property
    def tool(self) -> str:
        return TOOL_OF[self.kind]

    @property
    def orders(self) -> dict[str, str]:
        index = ITEMS.index(self.item)
        items = (self.item, ITEMS[(index + 5) % len(ITEMS)], ITEMS[(index + 7) % len(ITEMS)])
        return {item: STATUSES[_hash(f"status:{item}") % len(STATUSES)] for item in items}

    @property
    def call(self) -> dict[str, Any]:
        return {"name": self.tool, "arguments": {"item": self.item}}

    @property
    def key(self) -> str:
        return f"{self.kind}-{self.item}-{self.phrasing}"

    def result(self) -> str:
        """The tool message the desk answers the call with."""
        status = self.orders[self.item] if self.kind == "lookup" else "cancelled"
        return f"the {self.item} order is {status}"

    def reply(self) -> str:
        """The assistant's closing answer, from the tool's result."""
        return f"Done: {self.result()}."


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _use(kind: str, item: str) -> str:
    """Held out: cancelling every other item's order (the odd places in ITEMS); the rest
    trains. Every item is looked up in the base's pretraining."""
    if kind == "lookup":
        return "lookup"
    return "held_out" if ITEMS.index(item) % 2 == 1 else "train"


def requests(use: str) -> list[Request]:
    """Every request of `use` (held_out, train, demo, lookup), in a fixed order that looks
    random (a hash: the same on every machine). `demo` is the first phrasing of each train
    item, for the demonstrations: DEMONSTRATIONS of them are shown."""
    if use not in USES:
        raise ValueError(f"unknown use {use!r}; one of {', '.join(USES)}")
    wanted = "train" if use == "demo" else use
    made = [
        Request(kind, item, phrasing)
        for kind in PHRASES
        for item in ITEMS
        for phrasing in range(len(PHRASES[kind]))
        if _use(kind, item) == wanted and (use != "demo" or phrasing == 0)
    ]
    return sorted(made, key=lambda request: _hash(f"{use}:{request.key}"))


def conversation(request: Request) -> list[dict[str, Any]]:
    """The whole episode as chat messages: the request, the call, the tool's answer, the reply."""
    return [
        {"role": "user", "content": request.prompt},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": request.call}]},
        {"role": "tool", "name": request.tool, "content": request.result()},
        {"role": "assistant", "content": request.reply()},
    ]  # fmt: skip


def environment_spec(request: Request) -> dict[str, Any]:
    """The request as an environment spec (flywheel.sandbox.environment's format)."""
    return {
        "source": SOURCE,
        "classes": {CLASS_NAME: {"orders": request.orders}},
        "turns": [[{"role": "user", "content": request.prompt}]],
        "ground_truth": [[request.call]],
        "max_steps": 4,
    }


def environment_task(request: Request, use: str) -> dict[str, Any]:
    """One line of a flywheel task file (`flywheel ingest tasks`): an environment task."""
    return {
        "task_id": f"orders-{use}-{request.key}",
        "kind": "environment",
        "prompt": request.prompt,
        "tools": TOOLS,
        "environment": environment_spec(request),
        "group": f"orders-{request.key}",
        "tags": [f"phrasing:{request.phrasing}"],
    }

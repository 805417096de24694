"""The demo's tool domain (`orders`): where the tiny model is to learn to act through a tool.

    write_tools(dir, quick=False)   # the base's conversations, held-out and train tasks, demos
    tools_plan(base, quick=False)   # the domain's config: primary metric, gate, dataset, cycle

What goes in, through the ordinary commands, and what comes out:

1. a tiny Qwen 2.5 base (`python -m finetune.tiny_chat`), pretrained on order *lookups*: it has
   seen tool calls and names the item asked about in one, but has never cancelled an order;
2. `flywheel ingest tasks orders-held-out.jsonl --verify`: environment tasks (verifier QA runs
   each ground truth in the sandbox) on the orders of items nothing trains on, then `flywheel
   dataset build`: with `dataset.min_eval_items` at their number they fill the frozen eval set;
3. `flywheel ingest tasks orders-train.jsonl --verify` and `flywheel ingest feedback
   orders-demonstrations.jsonl`: training tasks, and a few corrections that show the whole
   episode (the call the user says the assistant should have made, and the answer after the
   tool's result): the SFT demonstrations;
4. `flywheel cycle`: compile, build (the new groups go to train: eval is full and the
   fraction is 0), SFT on the demonstrations, GRPO in the sandboxed order desk on SFT merged,
   evaluate against the base on the held-out episodes, gate, promote;
5. `flywheel eval --model-version <the SFT version>`: SFT alone on the same held-out episodes,
   so the summary shows base -> SFT -> GRPO.

What it learns (bench/calibrate_tools.py, the same settings: tests/finetune/tool_chain.py):
held-out environment success 0.0 for the base on every seed of five, 0.75-1.0 after SFT on
eight demonstrations, the same or a little more after GRPO (+0.03 at most): SFT teaches the
new tool, GRPO in the environment keeps it. See flywheel.demo.orders for what it does not
learn.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from flywheel.demo import orders

TOOLS_DOMAIN = "orders"
PRETRAIN_STEPS = 150  # on the whole conversations, after the short ones are known
DEMONSTRATIONS = 8
HELD_OUT = 36  # every held-out request (9 items, 4 phrasings)
MISTAKE = "I have looked the order up."
"""The base's answer the demonstrations correct (it only knows lookups)."""

SFT_OVERRIDES = (
    "lora.r=16", "lora.alpha=32", "max_length=512", "max_steps=60", "learning_rate=1e-3",
    "per_device_train_batch_size=8", "warmup_ratio=0.05", "save_steps=60", "logging_steps=10",
    "lr_scheduler_type=linear",
)  # fmt: skip
GRPO_OVERRIDES = (
    "lora.r=16", "lora.alpha=32", "learning_rate=5e-4", "per_device_train_batch_size=8",
    "num_generations=4", "max_completion_length=64", "max_tool_calling_iterations=2",
    "temperature=1.0", "canary_fraction=0", "logging_steps=5", "loss_type=dapo",
    "dynamic_sampling=false", "lr_scheduler_type=linear",
)  # fmt: skip
GRPO_STEPS = {False: 40, True: 20}


@dataclass(frozen=True)
class ToolFiles:
    base_conversations: Path
    held_out_tasks: Path
    train_tasks: Path
    demonstrations: Path


def tools_plan(base: Path, *, quick: bool) -> dict[str, Any]:
    """The orders domain's config (`flywheel domains configure`)."""
    steps = GRPO_STEPS[quick]
    return {
        "base_model": str(base),
        "primary_metric": "environment_success",
        "gate": {"min_items": HELD_OUT},
        "dataset": {"min_eval_items": HELD_OUT},
        "cycle": {
            "methods": ["sft", "grpo"],
            "overrides": {
                "sft": list(SFT_OVERRIDES),
                "grpo": [*GRPO_OVERRIDES, f"max_steps={steps}", f"save_steps={steps}"],
            },
            "eval": {"max_new_tokens": 48, "k": 1},
            "recipe": {"eval_fraction": 0.0, "curriculum": "none"},
            "schedule": None,
        },
    }


def write_tools(directory: Path, *, quick: bool) -> ToolFiles:
    """The domain's input files, deterministic (the same arguments give the same bytes)."""
    from flywheel.demo.data import write_jsonl  # data imports this module's names

    directory = Path(directory)
    files = ToolFiles(
        directory / "orders-base-conversations.jsonl",
        directory / "orders-held-out.jsonl",
        directory / "orders-train.jsonl",
        directory / "orders-demonstrations.jsonl",
    )
    write_jsonl(files.base_conversations, base_conversations())
    held_out = orders.requests("held_out")
    write_jsonl(files.held_out_tasks, [orders.environment_task(r, "held_out") for r in held_out])
    train = orders.requests("train")
    write_jsonl(files.train_tasks, [orders.environment_task(r, "train") for r in train])
    demos = orders.requests("demo")[:DEMONSTRATIONS]
    write_jsonl(files.demonstrations, [event for r in demos for event in demonstration(r)])
    return files


def base_conversations() -> list[dict[str, Any]]:
    """What the base is pretrained on: every lookup (it has never cancelled or refunded)."""
    return [{"messages": orders.conversation(r), "tools": orders.TOOLS}
            for r in orders.requests("lookup")]  # fmt: skip


def openai_messages(request: orders.Request) -> list[dict[str, Any]]:
    """The request's whole episode in OpenAI's chat format: each call with an id and its
    arguments as JSON text, each tool message answering its call by id."""
    messages = []
    for number, message in enumerate(orders.conversation(request)):
        if message.get("tool_calls"):
            (call,) = message["tool_calls"]
            function = call["function"]
            message = {**message, "tool_calls": [{
                "id": f"call_{number}", "type": "function",
                "function": {"name": function["name"],
                             "arguments": json.dumps(function["arguments"])}}]}  # fmt: skip
        elif message["role"] == "tool":
            message = {**message, "tool_call_id": f"call_{number - 1}"}
        messages.append(message)
    return messages


def demonstration(request: orders.Request) -> list[dict[str, Any]]:
    """Corrections that together show one episode: each call the assistant should have made
    (after the results before it), and the answer it should have given after the last."""
    messages = openai_messages(request)
    base = {"domain": TOOLS_DOMAIN, "kind": "correction", "tools": orders.TOOLS,
            "rater": "demo-support-lead"}  # fmt: skip
    events = []
    for number, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        value = ({"tool_calls": message["tool_calls"]} if message.get("tool_calls")
                 else {"text": message["content"]})  # fmt: skip
        event_id = f"demo-orders-{request.key}-{number}"
        events.append({**base, "event_id": event_id, "messages": messages[:number],
                       "response": MISTAKE, "value": value})  # fmt: skip
    return events


Cli = Callable[..., Any]
"""`flywheel.demo.runner._cli`: one `flywheel` command run here, its JSON result returned."""


def run_tools_domain(
    cli: Cli, directory: Path, home: Path, tenant: str, *, quick: bool
) -> dict[str, Any]:
    """The whole tool domain through the CLI (see the module's docstring); what the summary
    shows of it."""
    files = write_tools(directory / "data", quick=quick)
    base = home / "models" / "tiny-orders-base"
    pretrain_base(files.base_conversations, base)
    config = directory / "config" / f"{TOOLS_DOMAIN}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(tools_plan(base, quick=quick), sort_keys=False), "utf-8")
    scope = ("--domain", TOOLS_DOMAIN, "--tenant", tenant)
    cli("domains", "create", TOOLS_DOMAIN, "--tenant", tenant)
    cli("domains", "configure", TOOLS_DOMAIN, "--tenant", tenant, "--file", str(config))
    ingested = {"orders held-out tasks": cli("ingest", "tasks", str(files.held_out_tasks), *scope)}
    cli("dataset", "build", *scope)  # the held-out tasks fill the frozen eval set
    ingested["orders train tasks"] = cli("ingest", "tasks", str(files.train_tasks), *scope)
    ingested["orders demonstrations"] = cli("ingest", "feedback", str(files.demonstrations), *scope)
    cycle = cli("cycle", *scope)
    sft_version = ((cycle.get("steps", {}).get("train_sft") or {}).get("result") or {}).get(
        "model_version"
    )
    sft_eval = None
    if sft_version:
        sft_eval = cli("eval", *scope, "--model-version", str(sft_version), "--k", "1",
                       "--max-new-tokens", "48", "--report-only")  # fmt: skip
    return {"ingested": ingested, "cycle": cycle, "sft_eval": sft_eval}


def pretrain_base(conversations: Path, out: Path) -> None:
    command = [sys.executable, "-m", "finetune.tiny_chat", "--out", str(out),
               "--conversations", str(conversations), "--steps", str(PRETRAIN_STEPS)]  # fmt: skip
    if subprocess.run(command, stdout=sys.stderr, check=False).returncode != 0:
        from flywheel.errors import InvalidState

        raise InvalidState("building the tool domain's tiny base failed (its output is above)")


def tool_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """base -> SFT -> GRPO held-out environment success, each on the same held-out episodes."""
    if not result:
        return []
    gate = ((result["cycle"].get("steps", {}).get("evaluate") or {}).get("result")) or {}
    sft = result.get("sft_eval") or {}
    metric = "environment_success"
    promoted = ((result["cycle"].get("steps", {}).get("promote") or {}).get("result")) or {}
    return [
        {"stage": "base", "version": "base",
         "held_out_success": (gate.get("against_summary") or {}).get(metric)},
        {"stage": "SFT (demonstrations)", "version": f"v{sft.get('version')}" if sft else "-",
         "held_out_success": (sft.get("summary") or {}).get(metric)},
        {"stage": "GRPO (in the environment)", "version": f"v{gate.get('version')}",
         "held_out_success": (gate.get("summary") or {}).get(metric),
         "gate": "passed" if gate.get("is_promotable") else "failed",
         "promoted": bool(promoted.get("promoted"))},
    ]  # fmt: skip

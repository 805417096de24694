"""Signal before it is stored: what ingestors, the feedback compiler and the API hand over.

Candidates carry raw text. `flywheel.signals.store` redacts it, hashes it, skips what the
domain already holds and writes the rest; nothing reaches a training table any other way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flywheel.feedback.service import NewFeedback

Messages = list[dict[str, str]]  # [{"role": "user" | "assistant" | "system", "content": ...}]


@dataclass(frozen=True)
class Provenance:
    """Where a candidate came from.

    `source_ref` is the source's own id for it ("zendesk:4711", "repo@<sha>:pkg/m.py::f"),
    `group_key` the unit that must never straddle train and eval (a ticket thread, a
    repository, a prompt), `names` the person names the source itself knows (requester,
    assignee, commenters): they are redacted wherever they appear, and `tags` the source's
    own labels of the item ("ticket.category:billing", "skill:carry"): the evaluation's
    slices. Tags say what an item is about, not what it is: they are left out of the content
    hash, so the same content labelled twice is still one item (the first labels stay).
    """

    source_kind: str  # one of flywheel.signals.models.SOURCE_KINDS
    source_ref: str
    group_key: str
    names: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class SftCandidate:
    provenance: Provenance
    messages: Messages
    completion: str
    weight: float = 1.0


@dataclass(frozen=True)
class PairCandidate:
    provenance: Provenance
    messages: Messages
    chosen: str
    rejected: str
    why: str
    weight: float = 1.0


@dataclass(frozen=True)
class LabelCandidate:
    """An unpaired judgement of one completion (KTO-style)."""

    provenance: Provenance
    messages: Messages
    completion: str
    is_desirable: bool
    why: str
    weight: float = 1.0


@dataclass(frozen=True)
class TaskCandidate:
    """A verifiable task. Hidden tests and the reference never appear in `prompt`."""

    provenance: Provenance
    prompt: str
    entry_point: str | None
    reference_solution: str | None
    hidden_tests: str | None
    visible_tests: str | None = None
    task_kind: str = "code"  # "code" | "answer" | "tool_call" | "environment"
    answer: str | None = None
    language: str = "python"
    weight: float = 1.0
    # The prompt as chat messages when it is more than one user turn (None: `prompt` is it).
    messages: Messages | None = None
    # OpenAI function tools offered to the model: {"type": "function", "function": {...}}.
    tools: list[dict[str, Any]] | None = None
    # tool_call: the calls to make, order-free, each argument with its acceptable values
    # ("" among them: it may be left out), as BFCL's possible answers are written:
    # [{"name": "area", "arguments": {"base": [10], "unit": ["cm", ""]}}].
    expected_calls: list[dict[str, Any]] | None = None
    # environment: {"source", "classes": {name: initial config}, "turns", "ground_truth",
    # "max_steps"}; see flywheel.sandbox.environment.
    environment: dict[str, Any] | None = None


@dataclass(frozen=True)
class FeedbackItem:
    """One judgement of an interaction, as a feedback event (see flywheel.feedback.values)."""

    kind: str  # rating | correction | comparison | outcome
    value: dict[str, Any]
    event_id: str  # the source's own id for it: re-ingesting finds it by (tenant, event_id)
    rater: str | None = None


@dataclass(frozen=True)
class InteractionCandidate:
    """A past model/agent answer with the judgements it got (a ticket's first resolution with
    its satisfaction rating, say): stored as an interaction with feedback events, which the
    feedback compiler turns into signal like any other feedback."""

    provenance: Provenance
    messages: Messages
    response: str
    feedback: tuple[FeedbackItem, ...] = field(default=())


@dataclass(frozen=True)
class EventCandidate:
    """A raw feedback event read from a file: stored as if the API had received it, under its
    own idempotency key. `provenance.source_ref` names it in errors ("feedback.jsonl line 7")."""

    provenance: Provenance
    event: NewFeedback
    idempotency_key: str


Candidate = (
    SftCandidate
    | PairCandidate
    | LabelCandidate
    | TaskCandidate
    | InteractionCandidate
    | EventCandidate
)

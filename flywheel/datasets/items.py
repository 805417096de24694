"""What a dataset version is built from: the signal tables as item kinds, an item's plain
row (text to decontaminate, prompt key, weight, group).

    for item in eligible_items(session, domain_id, recipe.ngram): ...

An item's prompt key (`flywheel.signals.content.prompt_key`: its conversation up to the
completion, system messages aside, normalised) is the unit that keeps train and eval apart:
the same question in another domain, another table or another week has the same key.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import ColumnElement, Select, Text, and_, func, null, or_, select
from sqlalchemy import cast as cast_
from sqlalchemy.orm import Session

from flywheel.datasets.models import SKETCHER, ItemSketch
from flywheel.db import streamed
from flywheel.signals.content import prompt_key, task_prompt_key
from flywheel.signals.models import LabeledCompletion, PreferencePair, SftExample, VerifiableTask


@dataclass(frozen=True)
class ItemKind:
    """One signal table as a source of dataset items."""

    name: str  # "sft", "pair", "label", "task"
    model: type[SftExample] | type[PreferencePair] | type[LabeledCompletion] | type[VerifiableTask]
    member_column: str


KINDS = (
    ItemKind("sft", SftExample, "sft_example_id"),
    ItemKind("pair", PreferencePair, "preference_pair_id"),
    ItemKind("label", LabeledCompletion, "labeled_completion_id"),
    ItemKind("task", VerifiableTask, "verifiable_task_id"),
)
KIND_OF_COLUMN = {kind.member_column: kind for kind in KINDS}
"""The item kind a member column refers to."""


@dataclass
class Item:
    kind: str
    id: uuid.UUID
    group_key: str
    content_sha256: str
    weight: float
    source_kind: str
    prompt_key: str | None  # its hash, from its sketch (None before it has one by the rules)
    difficulty: float | None = None
    mixed_from: str | None = None  # the other domain it was mixed in from


def eligible_items(session: Session, domain_id: uuid.UUID, ngram_words: int) -> Iterator[Item]:
    """Plain rows (no ORM objects: a build reads every item of the domain), streamed (no
    other statement may run on the session until the last one is read), with the prompt-key
    hash of their sketch by the current rules for n-grams of `ngram_words`
    words (None without one). What versions held comes separately (`History`): joined in
    here, the planner looped over every version's rows per item while its statistics lagged
    a new version (9 to 105 s instead of 1.6 s at 280k items)."""
    for kind in KINDS:
        for row in streamed(session, eligible_query(kind, domain_id, ngram_words)):
            yield item_of(kind, row)


def eligible_query(kind: ItemKind, domain_id: uuid.UUID, ngram_words: int) -> Select[Any]:
    """`item_query` over the domain's eligible items of `kind` (`is_eligible`)."""
    return item_query(kind, ngram_words).where(
        kind.model.domain_id == domain_id, is_eligible(kind.model)
    )


def item_query(kind: ItemKind, ngram_words: int) -> Select[Any]:
    """The columns an `Item` is made of (`item_of`), from the kind's table and its sketch by
    the current rules (outer-joined: None without one), for more joins and conditions."""
    model = kind.model
    sketch = ItemSketch.__table__.c
    difficulty = VerifiableTask.difficulty if model is VerifiableTask else null()
    return select(
        model.id,
        model.group_key,
        model.content_sha256,
        model.weight,
        model.source_kind,
        difficulty,
        sketch.prompt_key,
    ).outerjoin(
        ItemSketch,
        and_(
            sketch[kind.member_column] == model.id,
            sketch.ngram_words == ngram_words,
            sketch.sketcher == SKETCHER,
        ),
    )


def item_of(kind: ItemKind, row: Any) -> Item:
    """The item of a row whose first columns are `item_query`'s."""
    item_id, group_key, sha256, weight, source, ease, key = tuple(row)[:7]
    return Item(
        kind=kind.name,
        id=item_id,
        group_key=group_key,
        content_sha256=sha256,
        weight=weight,
        source_kind=source,
        prompt_key=key,
        difficulty=ease,
    )


def is_eligible(model: Any) -> ColumnElement[bool]:
    """Whether an item may be in a version: weight > 0 (not retracted), not a near-duplicate
    of another item, and for tasks checked by running, what verifier QA found usable."""
    eligible = and_(model.weight > 0, model.duplicate_of_id.is_(None))
    if model is not VerifiableTask:
        return eligible
    return and_(
        eligible,
        or_(
            VerifiableTask.task_kind == "answer",
            and_(
                VerifiableTask.task_kind.in_(("code", "tool_call", "environment")),
                VerifiableTask.verifier_status == "usable",
            ),
        ),
    )


@dataclass
class History:
    """What earlier versions of a domain held: every item, and the eval ones (mixed-in items
    of other domains included); read with the domain's open rows, by
    `flywheel.datasets.membership.DomainRows.load`."""

    seen: set[tuple[str, uuid.UUID]]
    evaluated: set[tuple[str, uuid.UUID]]

    def add(self, kind: str, item_id: uuid.UUID, split: str) -> None:
        """A version held the item in `split`."""
        self.seen.add((kind, item_id))
        if split == "eval":
            self.evaluated.add((kind, item_id))


def text_columns(model: Any) -> tuple[Any, ...]:
    """The columns of the text decontamination compares: what a model would read or write
    (a task's prompt; a conversation, as JSON text, and its responses)."""
    if model is VerifiableTask:
        return (model.prompt,)
    if model is PreferencePair:
        return (
            *(cast_(model.messages, Text), model.chosen, model.rejected),
            *(_calls_text(model.chosen_tool_calls), _calls_text(model.rejected_tool_calls)),
        )
    return (cast_(model.messages, Text), model.completion, _calls_text(model.completion_tool_calls))


def _calls_text(column: Any) -> Any:
    """A completion's tool calls as JSON text ("" for none): what the model would write."""
    return func.coalesce(cast_(column, Text), "")


def text_and_key(parts: list[Any]) -> tuple[str, str]:
    """The text decontamination compares, and the prompt key (`signals.content.prompt_key`),
    from the `text_columns` of one item (its messages parsed once)."""
    if len(parts) == 1:  # a task: its prompt
        return str(parts[0]), task_prompt_key(str(parts[0]))
    messages_json, *responses = parts
    messages = messages_of(messages_json)
    # System prompts are left out: a fixed one of 13+ words would make every item "overlap".
    prompt = "\n".join(
        str(message.get("content", "")) for message in messages if message.get("role") != "system"
    )
    said = [response for response in responses if response]  # no calls: as it always was
    return "\n".join([prompt, *said]), prompt_key(messages)


def messages_of(messages_json: Any) -> list[dict[str, Any]]:
    """A messages column as read: JSON text (cast for the text columns) or already parsed."""
    parsed = orjson.loads(messages_json) if isinstance(messages_json, str) else messages_json
    return list(parsed)

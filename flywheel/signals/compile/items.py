"""From evidence rows to staged items: group rows by prompt, judge, redact, hash, stage.

Rows arrive ordered by a prompt key (on PostgreSQL a 64-bit hash of the stored conversation),
so one prompt's rows are contiguous; within a key, rows are split by the conversation itself
and merged by `group_key`, the content hash of the normalised conversation.

Each distinct text is redacted and normalised once per run (`Texts`), and content hashes are
computed from those normalised forms: `flywheel.signals.content.messages_digest` of them
equals `content_sha256(kind, *raw)` because normalising is idempotent (a test holds the two
equal), and it spares normalising a prompt's conversation once per item.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import orjson

from flywheel.redaction import redact
from flywheel.signals.compile.evidence import COMPARISON, CORRECTION, SCORE, TIES, Row
from flywheel.signals.compile.rules import PromptEvidence, Scores, Verdicts, Votes
from flywheel.signals.compile.writer import Writer
from flywheel.signals.content import messages_digest, normalise_text

MAX_SOURCE_REF = 1024
TEXT_CACHE_SIZE = 200_000


@dataclass(frozen=True, slots=True)
class Clean:
    """A text as stored: redacted, its placeholder counts, and its normalised form."""

    text: str
    counts: dict[str, int]
    normal: str


class Texts:
    """`redact` and `normalise_text`, each distinct text once per run (a cache is emptied
    when it holds TEXT_CACHE_SIZE texts, to bound memory). Only texts that reach an item are
    redacted."""

    def __init__(self) -> None:
        self.clean: dict[str, Clean] = {}
        self.normals: dict[str, str] = {}

    def __call__(self, raw: str) -> Clean:
        found = self.clean.get(raw)
        if found is None:
            if len(self.clean) >= TEXT_CACHE_SIZE:
                self.clean.clear()
            redaction = redact(raw)
            normal = normalise_text(redaction.text) if redaction.counts else self.normal(raw)
            found = Clean(redaction.text, redaction.counts, normal)
            self.clean[raw] = found
        return found

    def normal(self, raw: str) -> str:
        """The normalised raw text (before redaction): what tells two responses apart."""
        found = self.normals.get(raw)
        if found is None:
            if len(self.normals) >= TEXT_CACHE_SIZE:
                self.normals.clear()
            found = self.normals[raw] = normalise_text(raw)
        return found


@dataclass
class Prompt:
    """One prompt's conversation, redacted, and all the evidence about it."""

    group_key: str
    messages_json: str  # redacted, as stored
    normal_messages: list[Any]  # redacted and normalised, as hashed
    normal_json: bytes  # the same, as JSON
    counts: Counter[str]  # placeholders in the conversation
    evidence: PromptEvidence = field(default_factory=PromptEvidence)


def prompts(rows: Iterable[Row], texts: Texts) -> Iterator[Prompt]:
    """The prompts of the rows, each with its merged evidence."""
    for _, same_key in itertools.groupby(rows, key=itemgetter(0)):
        group = list(same_key)
        by_group: dict[str, Prompt] = {}
        if any(row[1] != group[0][1] for row in group):
            group.sort(key=itemgetter(1))  # a hash collision: two conversations, one key
        for messages_json, same_messages in itertools.groupby(group, key=itemgetter(1)):
            found = _prompt(messages_json, texts)
            prompt = by_group.setdefault(found.group_key, found)
            for row in same_messages:
                _add_row(prompt.evidence, row, texts)
        yield from by_group.values()


def group_key_of(messages_json: str) -> str:
    """The `group_key` the compiler gives the items of this conversation (JSON text)."""
    return _prompt(messages_json, Texts()).group_key


def _prompt(messages_json: str, texts: Texts) -> Prompt:
    messages = orjson.loads(messages_json)
    counts: Counter[str] = Counter()
    stored, normal = [], []
    for message in messages:
        clean = texts(message["content"])
        counts.update(clean.counts)
        stored.append({**message, "content": clean.text})
        normal.append(_normal_message(message, clean.normal, texts))
    normal_json = raw_normal_json = orjson.dumps(normal)
    if counts:  # the conversation as stored differs from the one that defines the group
        messages_json = orjson.dumps(stored).decode()
        raw_normal_json = orjson.dumps(
            [
                _normal_message(message, texts.normal(message["content"]), texts)
                for message in messages
            ]
        )
    return Prompt(
        group_key=messages_digest("prompt", raw_normal_json),
        messages_json=messages_json,
        normal_messages=normal,
        normal_json=normal_json,
        counts=counts,
    )


def _normal_message(message: dict[str, Any], content: str, texts: Texts) -> dict[str, Any]:
    """The message as `content_sha256` normalises it: keys sorted, strings normalised."""
    return {
        key: content if key == "content" else _normal_json(value, texts)
        for key, value in sorted(message.items())
    }


def _normal_json(value: Any, texts: Texts) -> Any:
    if isinstance(value, str):
        return texts.normal(value)
    if isinstance(value, list | tuple):
        return [_normal_json(item, texts) for item in value]
    if isinstance(value, dict):
        return {key: _normal_json(item, texts) for key, item in sorted(value.items())}
    return value


def _add_row(evidence: PromptEvidence, row: Row, texts: Texts) -> None:
    _, _, what, a, b, raters, total, newest_us, kind_bits, refs = row
    if what == TIES:
        evidence.ties += raters
        return
    a_key = _text_key(evidence, a, texts)
    if what == SCORE:
        evidence.scores.setdefault(a_key, Scores()).add(raters, total, newest_us, kind_bits, refs)
        return
    if what not in (CORRECTION, COMPARISON):
        raise ValueError(f"unknown evidence row kind {what}")
    votes = evidence.corrections if what == CORRECTION else evidence.comparisons
    votes.setdefault((a_key, _text_key(evidence, b, texts)), Votes()).add(raters, newest_us, refs)


def _text_key(evidence: PromptEvidence, text: str, texts: Texts) -> str:
    """Responses are told apart by their normalised raw text."""
    key = texts.normal(text)
    evidence.texts.setdefault(key, text)
    return key


def stage(prompt: Prompt, verdicts: Verdicts, writer: Writer, texts: Texts) -> Counter[str]:
    """Hash and stage the prompt's items; how many of each were staged."""
    staged: Counter[str] = Counter()
    messages = prompt.normal_json
    for pair in verdicts.pairs:
        chosen, rejected = texts(pair.chosen), texts(pair.rejected)
        if chosen.normal == rejected.normal:
            continue  # the two differed only in what redaction removed
        content_sha256 = messages_digest("pair", messages, chosen.normal, rejected.normal)
        row: tuple[Any, ...] = (
            *_provenance(prompt, pair.refs, (chosen, rejected), pair.weight, content_sha256),
            prompt.messages_json,
            chosen.text,
            rejected.text,
            pair.why[:255],
        )
        staged["pairs"] += writer.add("preference_pairs", row)
    for example in verdicts.sft:
        completion = texts(example.completion)
        content_sha256 = messages_digest("sft", messages, completion.normal)
        row = (
            *_provenance(prompt, example.refs, (completion,), example.weight, content_sha256),
            prompt.messages_json,
            completion.text,
        )
        staged["sft"] += writer.add("sft_examples", row)
    for label in verdicts.labels:
        completion = texts(label.completion)
        content_sha256 = messages_digest("label", messages, completion.normal, label.is_desirable)
        row = (
            *_provenance(prompt, label.refs, (completion,), label.weight, content_sha256),
            prompt.messages_json,
            completion.text,
            label.is_desirable,
            label.why[:255],
        )
        staged["labels"] += writer.add("labeled_completions", row)
    return staged


def _provenance(
    prompt: Prompt,
    refs: tuple[str, ...],
    texts: tuple[Clean, ...],
    weight: float,
    content_sha256: str,
) -> tuple[str, str, str, str, float]:
    """(source_ref, group_key, content_sha256, redaction_report, weight), as staged."""
    counts = prompt.counts
    if any(text.counts for text in texts):
        counts = prompt.counts.copy()
        for text in texts:
            counts.update(text.counts)
    report = orjson.dumps(dict(counts)).decode() if counts else "{}"
    return (source_ref(refs), prompt.group_key, content_sha256, report, weight)


def source_ref(refs: tuple[str, ...]) -> str:
    """`feedback:` and the interactions/events an item came from, cut to fit the column with
    a count of what was left out."""
    text = "feedback:" + ",".join(refs)
    if len(text) <= MAX_SOURCE_REF:
        return text
    kept: list[str] = []
    size = len("feedback:") + len(",+99999 more")
    for ref in refs:
        if size + len(ref) + 1 > MAX_SOURCE_REF:
            break
        kept.append(ref)
        size += len(ref) + 1
    return "feedback:" + ",".join(kept) + f",+{len(refs) - len(kept)} more"

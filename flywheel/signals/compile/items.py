"""From evidence rows to staged items: group rows by prompt, judge, redact, hash, stage.

Rows arrive ordered by a prompt key (on PostgreSQL a 64-bit hash of the stored conversation),
so one prompt's rows are contiguous; within a key, rows are split by the conversation itself
and merged by `group_key`, the content hash of the normalised conversation.

Each distinct text is redacted and normalised once per run and prompt (`Texts`; the prompt's
group key is the scope of its surrogates), and content hashes are
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

from flywheel.redaction import Span, Surrogates, apply, find_spans
from flywheel.redaction.keys import redaction_key
from flywheel.signals.compile.evidence import COMPARISON, CORRECTION, SCORE, TIES, Row
from flywheel.signals.compile.rules import PromptEvidence, Scores, Verdicts, Votes
from flywheel.signals.compile.turns import CleanTurn, clean, decode, is_turn, json_or_none
from flywheel.signals.compile.turns import key as turn_key
from flywheel.signals.compile.writer import Writer
from flywheel.signals.content import messages_digest, normalise_text
from flywheel.signals.message_texts import map_texts
from flywheel.signals.spans_ahead import text_digest

MAX_SOURCE_REF = 1024
TEXT_CACHE_SIZE = 200_000


@dataclass(frozen=True, slots=True)
class Clean:
    """A text as stored: redacted (surrogates in place of what was found), its placeholder
    counts, its normalised form, and the normalised form with typed placeholders instead of
    surrogates (what tells two responses apart by more than what redaction replaced)."""

    text: str
    counts: dict[str, int]
    normal: str
    typed: str


class Texts:
    """`redact` and `normalise_text`, each distinct text once per run and prompt (a cache is
    emptied when it holds TEXT_CACHE_SIZE texts, to bound memory); a text without finds is the
    same in every prompt and done once per run. Only texts that reach an item are redacted.
    The prompt's group key is the scope of its surrogates."""

    def __init__(self) -> None:
        self.plain: dict[str, Clean] = {}
        self.scoped: dict[tuple[str, str], Clean] = {}
        self.finds: dict[str, list[Span]] = {}
        self.normals: dict[str, str] = {}
        self.ahead: dict[bytes, list[Span]] = {}
        """Spans found by another process, by `text_digest` (`prefetch`)."""

    def __call__(self, raw: str, scope: str = "") -> Clean:
        found = self.plain.get(raw) or self.scoped.get((scope, raw))
        if found is not None:
            return found
        spans = self.finds.get(raw)
        if spans is None:
            if len(self.finds) >= TEXT_CACHE_SIZE:
                self.finds.clear()
            found_ahead = self.ahead.get(text_digest(raw)) if self.ahead else None
            spans = self.finds[raw] = find_spans(raw) if found_ahead is None else found_ahead
        if not spans:
            if len(self.plain) >= TEXT_CACHE_SIZE:
                self.plain.clear()
            normal = self.normal(raw)
            found = self.plain[raw] = Clean(raw, {}, normal, normal)
            return found
        if len(self.scoped) >= TEXT_CACHE_SIZE:
            self.scoped.clear()
        redaction = apply(raw, spans, Surrogates(redaction_key(), scope))
        found = Clean(
            redaction.text,
            redaction.counts,
            normalise_text(redaction.text),
            normalise_text(redaction.typed),
        )
        self.scoped[(scope, raw)] = found
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
    """The `group_key` the compiler gives the items of this conversation (JSON text): the
    digest of the conversation as sent, normalised, as `_prompt` computes it before it redacts
    (so without redacting: the gateway's recorder asks for it on every call)."""
    texts = Texts()
    normal = [_normal_json(message, texts) for message in orjson.loads(messages_json)]
    return messages_digest("prompt", orjson.dumps(normal))


def _prompt(messages_json: str, texts: Texts) -> Prompt:
    messages = orjson.loads(messages_json)
    normal = [_normal_json(message, texts) for message in messages]
    normal_json = orjson.dumps(normal)
    group_key = messages_digest("prompt", normal_json)  # the conversation as sent
    counts: Counter[str] = Counter()

    def redacted(raw: str) -> str:
        clean = texts(raw, group_key)
        counts.update(clean.counts)
        return clean.text

    # Every text: contents, text parts, names, tool call arguments' strings, tool results.
    stored = [map_texts(message, redacted) for message in messages]
    if counts:  # the conversation as stored differs from the one that defines the group
        messages_json = orjson.dumps(stored).decode()
        normal = [_normal_json(message, texts) for message in stored]
        normal_json = orjson.dumps(normal)
    return Prompt(
        group_key=group_key,
        messages_json=messages_json,
        normal_messages=normal,
        normal_json=normal_json,
        counts=counts,
    )


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
    """Responses are told apart by their normalised raw text (a tool-calling one by its
    normalised turn and tools: `turns.key`)."""
    found = turn_key(text, texts.normal)
    evidence.texts.setdefault(found, text)
    return found


def stage(prompt: Prompt, verdicts: Verdicts, writer: Writer, texts: Texts) -> Counter[str]:
    """Hash and stage the prompt's items; how many of each were staged."""
    staged: Counter[str] = Counter()
    messages = prompt.normal_json
    scope = prompt.group_key
    for pair in verdicts.pairs:
        chosen = completion(pair.chosen, scope, texts)
        rejected = completion(pair.rejected, scope, texts)
        if chosen.typed == rejected.typed:
            continue  # the two differed only in what redaction removed
        extra = [{"chosen": chosen.extra, "rejected": rejected.extra}] * bool(
            chosen.extra or rejected.extra
        )
        content_sha256 = messages_digest("pair", messages, chosen.normal, rejected.normal, *extra)
        row: tuple[Any, ...] = (
            *_provenance(prompt, pair.refs, (chosen, rejected), pair.weight, content_sha256),
            prompt.messages_json,
            chosen.text,
            rejected.text,
            pair.why[:255],
            json_or_none(chosen.tools or rejected.tools),
            json_or_none(chosen.tool_calls),
            json_or_none(rejected.tool_calls),
        )
        staged["pairs"] += writer.add("preference_pairs", row)
    for example in verdicts.sft:
        done = completion(example.completion, scope, texts)
        content_sha256 = messages_digest("sft", messages, done.normal, *_extra(done))
        row = (
            *_provenance(prompt, example.refs, (done,), example.weight, content_sha256),
            prompt.messages_json,
            done.text,
            json_or_none(done.tools),
            json_or_none(done.tool_calls),
        )
        staged["sft"] += writer.add("sft_examples", row)
    for label in verdicts.labels:
        done = completion(label.completion, scope, texts)
        content_sha256 = messages_digest(
            "label", messages, done.normal, label.is_desirable, *_extra(done)
        )
        row = (
            *_provenance(prompt, label.refs, (done,), label.weight, content_sha256),
            prompt.messages_json,
            done.text,
            label.is_desirable,
            label.why[:255],
            json_or_none(done.tools),
            json_or_none(done.tool_calls),
        )
        staged["labels"] += writer.add("labeled_completions", row)
    return staged


def completion(raw: str, scope: str, texts: Texts) -> CleanTurn:
    """A response as stored: redacted, normalised, hashed; a tool-calling (or tools-offered)
    one with its redacted calls and its tools (`turns`)."""
    turn = decode(raw) if is_turn(raw) else None
    if turn is None or (turn.tool_calls is None and turn.tools is None):
        found = texts(raw if turn is None else turn.content, scope)
        return CleanTurn(found.text, None, None, found.counts, found.normal, {}, found.typed)

    def redact(text: str) -> tuple[str, dict[str, int], str]:
        found = texts(text, scope)
        return found.text, found.counts, found.typed

    return clean(turn, redact)


def _extra(done: CleanTurn) -> list[dict[str, Any]]:
    """The content-hash part a tool-calling completion adds (none for a text one)."""
    return [done.extra] if done.extra else []


def _provenance(
    prompt: Prompt,
    refs: tuple[str, ...],
    texts: tuple[CleanTurn, ...],
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

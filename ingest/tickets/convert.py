"""A support thread becomes signal: the rules, written once for every vendor.

- The problem is the subject and what the customer wrote before the first agent reply.
- A resolution is the last public agent reply before the ticket was resolved. Resolving,
  reopening and resolving again gives two; when the answer given the second time is the
  same (a customer's "thanks!" reopens a Zendesk ticket, the agent solves it again), the
  reopen judged nothing and the two count as one.
- The final resolution is accepted unless the customer rated it badly (thumbs down, or 1-2
  stars): it becomes an SFT example (problem -> final resolution).
- A reopened ticket that ended with a different answer gives a preference pair: the final
  resolution over the first.
- Past answers with a verdict become interactions with feedback events: each reopened
  resolution gets outcome {"success": false, "reason": "ticket reopened"}; the answer an
  escalation overruled (the last agent reply before the escalation, or the first agent
  reply when the export does not say when it happened) gets "ticket escalated"; the final
  resolution gets the satisfaction rating.

Every candidate of a thread has the thread's key ("zendesk:4711") as group key, so the thread
never straddles train and eval. Each interaction is named after the comment it holds
("zendesk:4711:comment:9003"): the store derives an interaction's id from that name.
"""

from __future__ import annotations

from flywheel.feedback.values import MAX_TEXT_CHARS
from flywheel.signals.candidates import (
    Candidate,
    FeedbackItem,
    InteractionCandidate,
    Messages,
    PairCandidate,
    Provenance,
    SftCandidate,
)
from ingest.framework import Rejected
from ingest.tickets.thread import Change, Post, Thread

REOPENED_WHY = "reopened: final resolution over the first"


def thread_candidates(thread: Thread) -> list[Candidate]:
    """The candidates a thread yields; Rejected (`unresolved`, `no_customer_message`,
    `no_agent_reply`, `too_long`) when it yields none."""
    if not thread.is_resolved:
        raise Rejected("unresolved", thread.key)
    messages: Messages = [{"role": "user", "content": _problem(thread)}]
    resolutions = _resolutions(thread)
    if not resolutions:
        raise Rejected("no_agent_reply", f"{thread.key} was resolved without a public agent reply")
    if any(len(text) > MAX_TEXT_CHARS for text in [messages[0]["content"], *_texts(resolutions)]):
        raise Rejected("too_long", f"{thread.key} has a message over {MAX_TEXT_CHARS} characters")
    provenance = Provenance("ticket", thread.key, thread.key, thread.names, thread.tags)
    final = resolutions[-1].text
    candidates: list[Candidate] = []
    if thread.rating is None or not thread.rating.is_negative:
        candidates.append(SftCandidate(provenance, messages, final))
        if len(resolutions) > 1:
            first = resolutions[0].text
            candidates.append(PairCandidate(provenance, messages, final, first, REOPENED_WHY))
    candidates += _interactions(thread, messages, resolutions)
    return candidates


def _problem(thread: Thread) -> str:
    parts: list[str] = []
    for entry in thread.timeline:
        if isinstance(entry, Post) and entry.role == "agent":
            break
        if isinstance(entry, Post) and entry.role == "customer" and entry.text:
            parts.append(entry.text)
    if not parts:
        raise Rejected("no_customer_message", f"{thread.key} has no message from the customer")
    subject = thread.subject.strip()
    if subject and not parts[0].startswith(subject):
        parts.insert(0, subject)
    return "\n\n".join(parts)


def _resolutions(thread: Thread) -> list[Post]:
    """The answer in place at each resolve, in order; one answer given twice counts once."""
    resolutions: list[Post] = []
    answer: Post | None = None
    is_open = True
    for entry in thread.timeline:
        if isinstance(entry, Post):
            answer = entry if entry.role == "agent" and entry.text else answer
        elif entry.kind == "resolved" and is_open:
            is_open = False
            _add_resolution(resolutions, answer)
        elif entry.kind == "reopened":
            is_open = True
    if is_open:  # resolved says the ticket's status, whatever the history kept
        _add_resolution(resolutions, answer)
    return resolutions


def _add_resolution(resolutions: list[Post], answer: Post | None) -> None:
    if answer is None:
        return
    if resolutions and _is_same(resolutions[-1].text, answer.text):
        resolutions[-1] = answer
    else:
        resolutions.append(answer)


def _is_same(left: str, right: str) -> bool:
    return " ".join(left.split()).casefold() == " ".join(right.split()).casefold()


def _texts(posts: list[Post]) -> list[str]:
    return [post.text for post in posts]


def _escalated_answer(thread: Thread, final: Post) -> Post | None:
    """The agent answer an escalation overruled, if there is one that is not the final."""
    first: Post | None = None
    last: Post | None = None
    for entry in thread.timeline:
        if isinstance(entry, Post) and entry.role == "agent" and entry.text:
            first, last = first or entry, entry
        elif isinstance(entry, Change) and entry.kind == "escalated":
            return last if last is not None and not _is_same(last.text, final.text) else None
    if thread.is_escalated and first is not None and not _is_same(first.text, final.text):
        return first
    return None


def _interactions(
    thread: Thread, messages: Messages, resolutions: list[Post]
) -> list[InteractionCandidate]:
    judged: dict[str, tuple[Post, list[FeedbackItem]]] = {}

    def judge(post: Post, item: FeedbackItem) -> None:
        judged.setdefault(post.ref, (post, []))[1].append(item)

    for number, post in enumerate(resolutions[:-1], 1):
        judge(post, _outcome("ticket reopened", f"{thread.key}:reopened:{number}"))
    escalated = _escalated_answer(thread, resolutions[-1])
    if escalated is not None:
        judge(escalated, _outcome("ticket escalated", f"{thread.key}:escalated"))
    if thread.rating is not None:
        judge(
            resolutions[-1],
            FeedbackItem("rating", dict(thread.rating.value), f"{thread.key}:satisfaction"),
        )
    return [
        InteractionCandidate(
            Provenance(
                "ticket", f"{thread.key}:comment:{ref}", thread.key, thread.names, thread.tags
            ),
            messages,
            post.text,
            tuple(items),
        )
        for ref, (post, items) in judged.items()
    ]


def _outcome(reason: str, event_id: str) -> FeedbackItem:
    return FeedbackItem("outcome", {"success": False, "reason": reason}, event_id)

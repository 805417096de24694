"""Reading the evidence: raw events aggregated per (prompt, response), streamed prompt by prompt.

Every row is `(prompt_key, messages_json, what, a, b, raters, total, newest_us, kind_bits,
refs)`, ordered by `prompt_key` so that all rows of one prompt arrive together:

    SCORE       a = the response; raters, their summed latest scores (quarters), kind bits
    CORRECTION  a = the original response, b = the corrected text; raters
    COMPARISON  a = preferred over b; raters
    TIES        raters = tie comparisons about the prompt

A rater's latest judgement of a thing replaces their earlier ones (a changed mind is not two
votes): per response for ratings, outcomes and corrections, per comparison (prompt and its
list of responses) for comparisons. Events without a rater each count on their own, except
outcomes: a response has one outcome, the latest ("resolved", then "reopened", is a failure).

On PostgreSQL one set-based query does the aggregation and the server streams the result
through a server-side cursor. SQLite (the embedded default, small data) reads the events and
aggregates the same way in Python.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from flywheel.db import psycopg_connection
from flywheel.feedback.models import FeedbackEvent, Interaction
from flywheel.signals.compile.turns import encode, turn_sql

SCORE, CORRECTION, COMPARISON, TIES = 0, 1, 2, 3
MAX_REFS = 8  # event ids kept per aggregate for provenance; the count is in `raters`
FETCH_ROWS = 50_000

Row = tuple[Any, ...]

# The conversation an event is about: a comparison's own (`value.messages`) first; then the
# event's own conversation when it has no interaction, else its interaction's.
PROMPT_OF_EVENT = """
    CASE WHEN e.interaction_id IS NULL THEN coalesce(e.value -> 'messages', e.messages)
         WHEN e.kind = 'comparison' THEN coalesce(e.value -> 'messages', i.messages)
         ELSE i.messages END
"""
QUARTERS = """
    CASE WHEN kind = 'outcome' THEN CASE WHEN (value ->> 'success')::boolean THEN 4 ELSE 0 END
         WHEN value ? 'thumbs' THEN CASE WHEN value ->> 'thumbs' = 'up' THEN 4 ELSE 0 END
         ELSE (value ->> 'stars')::int - 1 END
"""
MICROS = "(date_part('epoch', {0}) * 1000000)::int8"
# A response as the evidence tells it apart: its text, or (with tool calls or tools) `turns`'s
# encoding; a correction's fix gets the tools of what it corrects.
OWN_RESPONSE = turn_sql("e.response", "NULL::jsonb", "e.tools")
INTERACTION_RESPONSE = turn_sql("response", "response_tool_calls", "tools")
FIXED = turn_sql(
    "value ->> 'text'",
    "value -> 'tool_calls'",
    "CASE WHEN interaction_id IS NULL THEN tools "
    "ELSE (SELECT i.tools FROM interactions i WHERE i.id = interaction_id) END",
)

# Keys are hashes (two 64-bit seeds where a collision would merge two things) or ids: hashing
# and sorting jsonb values themselves is what made the first version of this query slow.
H = "jsonb_hash_extended({0}, 0), jsonb_hash_extended({0}, 1)"
EVIDENCE_SQL = f"""
WITH ev AS NOT MATERIALIZED (
    SELECT e.id, e.created_at, e.kind, e.value, e.rater, e.interaction_id,
           CASE WHEN e.interaction_id IS NULL THEN e.messages END AS messages,
           CASE WHEN e.interaction_id IS NULL THEN {OWN_RESPONSE} END AS response,
           coalesce(e.rater, CASE WHEN e.kind = 'outcome' THEN '' ELSE e.id::text END) AS voter,
           CASE WHEN e.interaction_id IS NULL THEN e.tools END AS tools
    FROM feedback_events e
    WHERE e.tenant_id = %(tenant)s AND e.domain_id = %(domain)s {{touched_where}}
),
rated AS (
    SELECT interaction_id, kind, max({MICROS.format("created_at")} * 8 + {QUARTERS}) AS latest
    FROM ev WHERE kind IN ('rating', 'outcome') AND interaction_id IS NOT NULL
    GROUP BY interaction_id, kind, voter
),
scored AS (
    SELECT interaction_id, NULL::jsonb AS messages, {SCORE} AS what, NULL::text AS a,
           NULL::text AS b, count(*) AS raters, sum(latest %% 8)::int AS total,
           max(latest / 8) AS newest_us,
           bit_or(CASE kind WHEN 'rating' THEN 1 ELSE 2 END) AS kind_bits, NULL::text[] AS refs
    FROM rated GROUP BY interaction_id
),
own_rated AS (
    SELECT jsonb_hash_extended(messages, 0) AS h0, jsonb_hash_extended(messages, 1) AS h1,
           response, kind, (array_agg(messages))[1] AS messages,
           max({MICROS.format("created_at")} * 8 + {QUARTERS}) AS latest, min(id::text) AS ref
    FROM ev WHERE kind IN ('rating', 'outcome') AND interaction_id IS NULL
    GROUP BY 1, 2, response, kind, voter
),
own_scored AS (
    SELECT NULL::uuid, (array_agg(messages))[1], {SCORE}, response, NULL::text, count(*),
           sum(latest %% 8)::int, max(latest / 8),
           bit_or(CASE kind WHEN 'rating' THEN 1 ELSE 2 END),
           (array_agg('event/' || ref ORDER BY ref))[1:{MAX_REFS}]
    FROM own_rated GROUP BY h0, h1, response
),
corrected AS (
    SELECT DISTINCT ON (interaction_id, h0, h1, response, voter)
           interaction_id, h0, h1, response, messages, {FIXED} AS fixed, created_at, id
    FROM (SELECT ev.*, {H.format("messages")} FROM ev WHERE kind = 'correction')
        AS c(id, created_at, kind, value, rater, interaction_id, messages, response, voter, tools,
             h0, h1)
    ORDER BY interaction_id, h0, h1, response, voter, created_at DESC, id DESC
),
corrections AS (
    SELECT interaction_id, (array_agg(messages))[1], {CORRECTION}, response, fixed, count(*),
           0, max({MICROS.format("created_at")}), 0,
           CASE WHEN interaction_id IS NULL
                THEN (array_agg('event/' || id ORDER BY id))[1:{MAX_REFS}] END
    FROM corrected GROUP BY interaction_id, h0, h1, response, fixed
),
compared AS MATERIALIZED (
    SELECT DISTINCT ON (h0, h1, r0, r1, voter) h0, h1, prompt, value, created_at, id
    FROM (SELECT c.*, {H.format("prompt")}, {H.format("value -> 'responses'")}
          FROM (SELECT ev.*, coalesce(value -> 'messages', messages,
                    (SELECT i.messages FROM interactions i WHERE i.id = ev.interaction_id))
                FROM ev WHERE kind = 'comparison')
              AS c(id, created_at, kind, value, rater, interaction_id, messages, response, voter,
                   tools, prompt)) AS c(id, created_at, kind, value, rater, interaction_id,
                                        messages, response, voter, tools, prompt, h0, h1, r0, r1)
    ORDER BY h0, h1, r0, r1, voter, created_at DESC, id DESC
),
comparisons AS (
    SELECT NULL::uuid, (array_agg(prompt))[1], {COMPARISON},
           value -> 'responses' ->> (value ->> 'preferred')::int AS chosen, r.rejected,
           count(*), 0, max({MICROS.format("created_at")}), 0,
           (array_agg('event/' || id ORDER BY id))[1:{MAX_REFS}]
    FROM compared
    CROSS JOIN LATERAL jsonb_array_elements_text(value -> 'responses')
        WITH ORDINALITY AS r(rejected, position)
    WHERE value ? 'preferred' AND r.position - 1 <> (value ->> 'preferred')::int
    GROUP BY h0, h1, chosen, r.rejected
),
ties AS (
    SELECT NULL::uuid, (array_agg(prompt))[1], {TIES}, NULL::text, NULL::text, count(*), 0,
           0::int8, 0, NULL::text[]
    FROM compared WHERE value ? 'tie' AND (value ->> 'tie')::boolean
    GROUP BY h0, h1
)
SELECT coalesce(i.prompt_key, jsonb_hash_extended(x.messages, 0)) AS prompt_key,
       coalesce(i.messages, x.messages::text), x.what, coalesce(x.a, i.response), x.b,
       x.raters, x.total, x.newest_us, x.kind_bits,
       coalesce(x.refs, ARRAY['interaction/' || x.interaction_id])
FROM (SELECT * FROM scored UNION ALL SELECT * FROM own_scored
      UNION ALL SELECT * FROM corrections UNION ALL SELECT * FROM comparisons
      UNION ALL SELECT * FROM ties) x
LEFT JOIN (SELECT id, jsonb_hash_extended(messages, 0) AS prompt_key, messages::text AS messages,
                  {INTERACTION_RESPONSE} AS response
           FROM interactions WHERE tenant_id = %(tenant)s AND domain_id = %(domain)s) i
    ON i.id = x.interaction_id
WHERE x.interaction_id IS NULL OR i.id IS NOT NULL
ORDER BY prompt_key
"""

TOUCHED_PROMPTS_SQL = """
INSERT INTO compile_touched
SELECT DISTINCT jsonb_hash_extended(CAST(p AS jsonb), 0) FROM unnest(CAST(:prompts AS text[])) AS p
"""
TOUCHED_SQL = f"""
INSERT INTO compile_touched
SELECT DISTINCT jsonb_hash_extended({PROMPT_OF_EVENT}, 0)
FROM feedback_events e LEFT JOIN interactions i ON i.id = e.interaction_id
WHERE e.tenant_id = :tenant AND e.domain_id = :domain AND e.created_at > :since
"""
# The events of the touched prompts, found without hashing every event's conversation: those
# whose prompt is their interaction's (through the interactions of the touched prompts and
# the interaction index), then those that carry their own conversation (no interaction, or a
# comparison's own `messages`). The two parts split PROMPT_OF_EVENT's cases between them.
SCOPE_SQL = """
INSERT INTO compile_scope
SELECT e.id
FROM interactions i JOIN feedback_events e ON e.interaction_id = i.id
WHERE i.tenant_id = :tenant AND i.domain_id = :domain
  AND jsonb_hash_extended(i.messages, 0) IN (SELECT prompt_key FROM compile_touched)
  AND e.tenant_id = :tenant AND e.domain_id = :domain
  AND NOT (e.kind = 'comparison' AND e.value ? 'messages')
UNION ALL
SELECT e.id
FROM feedback_events e
WHERE e.tenant_id = :tenant AND e.domain_id = :domain
  AND (e.interaction_id IS NULL OR (e.kind = 'comparison' AND e.value ? 'messages'))
  AND jsonb_hash_extended(coalesce(e.value -> 'messages', e.messages), 0)
      IN (SELECT prompt_key FROM compile_touched)
"""
TOUCHED_WHERE = "AND e.id IN (SELECT id FROM compile_scope)"


@dataclass(frozen=True)
class Scope:
    """Which events to compile: the whole domain, or only some prompts (all of their events,
    old ones included): those with events after `since`, or the conversations in `prompts`
    (JSON texts, as stored)."""

    tenant_id: uuid.UUID
    domain_id: uuid.UUID
    since: datetime | None
    prompts: tuple[str, ...] | None = None

    @property
    def is_partial(self) -> bool:
        return self.since is not None or self.prompts is not None


def prepare(session: Session, scope: Scope) -> None:
    """Settings for the big query and, for a partial scope on PostgreSQL, the temporary
    tables of the prompt keys to recompile (those with events after `since`) and of all of
    those prompts' events."""
    if session.get_bind().dialect.name != "postgresql":
        return
    # per sort or hash table: ~1M events aggregate and sort in memory instead of on disk
    session.execute(text("SET LOCAL work_mem = '256MB'"))
    session.execute(text("SET LOCAL jit = off"))  # compiling these queries costs more than it saves
    if scope.is_partial:
        params = {
            "tenant": scope.tenant_id,
            "domain": scope.domain_id,
            "since": scope.since,
            "prompts": list(scope.prompts or ()),
        }
        for table, column in (
            ("compile_touched", "prompt_key bigint"),
            ("compile_scope", "id uuid"),
        ):
            # a transaction may recompile several scopes (forgetting across domains)
            session.execute(text(f"DROP TABLE IF EXISTS {table}"))
            session.execute(text(f"CREATE TEMP TABLE {table} ({column}) ON COMMIT DROP"))
        touched = TOUCHED_SQL if scope.prompts is None else TOUCHED_PROMPTS_SQL
        session.execute(text(touched), params)
        session.execute(text("ANALYZE compile_touched"))
        session.execute(text(SCOPE_SQL), params)
        session.execute(text("ANALYZE compile_scope"))


def evidence_rows(session: Session, scope: Scope) -> Iterator[Row]:
    """The evidence rows of the scope, ordered by prompt key (after `prepare`)."""
    if session.get_bind().dialect.name == "postgresql":
        return _postgres_rows(session, scope)
    return iter(_python_rows(session, scope))


def _postgres_rows(session: Session, scope: Scope) -> Iterator[Row]:
    partial = scope.is_partial
    sql = EVIDENCE_SQL.format(touched_where=TOUCHED_WHERE if partial else "")
    with psycopg_connection(session).cursor(name="compile_evidence", binary=True) as cursor:
        cursor.itersize = FETCH_ROWS
        cursor.execute(sql, {"tenant": scope.tenant_id, "domain": scope.domain_id})
        yield from cursor


def count_events(session: Session, scope: Scope) -> int:
    """How many events the scope covers (after `prepare`)."""
    if session.get_bind().dialect.name != "postgresql" or not scope.is_partial:
        query = select(FeedbackEvent.id).where(
            FeedbackEvent.tenant_id == scope.tenant_id, FeedbackEvent.domain_id == scope.domain_id
        )
        if not scope.is_partial:
            return int(session.execute(query.with_only_columns(func.count())).scalar_one())
        return sum(1 for _ in _scoped_events(session, scope))
    return int(session.execute(text("SELECT count(*) FROM compile_scope")).scalar_one())


# --- SQLite: the same aggregation in Python ------------------------------------------------

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class _Event:
    id: str
    micros: int
    kind: str
    value: dict[str, Any]
    rater: str | None
    interaction_id: str | None
    prompt_json: str
    response: str | None  # the evidence string (`turns`): its text, or its encoded turn
    tools: list[Any] | None  # the tools of what it is about (a correction's fix gets them)


def _micros(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(microseconds=1)


def _events(session: Session, scope: Scope) -> Iterator[_Event]:
    query = (
        select(
            FeedbackEvent.id,
            FeedbackEvent.created_at,
            FeedbackEvent.kind,
            FeedbackEvent.value,
            FeedbackEvent.rater,
            FeedbackEvent.interaction_id,
            FeedbackEvent.messages,
            FeedbackEvent.response,
            FeedbackEvent.tools,
            Interaction.messages,
            Interaction.response,
            Interaction.response_tool_calls,
            Interaction.tools,
        )
        .outerjoin(Interaction, Interaction.id == FeedbackEvent.interaction_id)
        .where(
            FeedbackEvent.tenant_id == scope.tenant_id, FeedbackEvent.domain_id == scope.domain_id
        )
    )
    for (
        event_id,
        created_at,
        kind,
        value,
        rater,
        interaction_id,
        own,
        own_response,
        own_tools,
        *of,
    ) in session.execute(query):
        prompt = event_prompt(kind, value, interaction_id, own, of[0])
        yield _Event(
            id=str(event_id),
            micros=_micros(created_at),
            kind=kind,
            value=value,
            rater=rater,
            interaction_id=None if interaction_id is None else str(interaction_id),
            prompt_json=prompt_json(prompt),
            **_response(interaction_id, own_response, own_tools, *of[1:]),
        )


def _response(
    interaction_id: uuid.UUID | None,
    own_response: str | None,
    own_tools: list[Any] | None,
    response: str,
    response_tool_calls: list[Any] | None,
    tools: list[Any] | None,
) -> dict[str, Any]:
    """An event's response (OWN_RESPONSE or INTERACTION_RESPONSE, in Python) and tools."""
    if interaction_id is not None:
        return {"response": encode(response, response_tool_calls, tools), "tools": tools}
    if own_response is None:
        return {"response": None, "tools": own_tools}
    return {"response": encode(own_response, None, own_tools), "tools": own_tools}


def event_prompt(
    kind: str,
    value: dict[str, Any],
    interaction_id: uuid.UUID | None,
    own_messages: list[Any] | None,
    interaction_messages: list[Any] | None,
) -> Any:
    """The conversation an event is about (PROMPT_OF_EVENT, in Python)."""
    if interaction_id is None:
        return value.get("messages", own_messages) if kind == "comparison" else own_messages
    if kind == "comparison":
        return value.get("messages", interaction_messages)
    return interaction_messages


def event_prompts(
    session: Session, tenant_id: uuid.UUID, event_ids: list[uuid.UUID]
) -> dict[uuid.UUID, set[str]]:
    """The conversations (JSON texts) the events are about, by domain: a `Scope.prompts`."""
    found: dict[uuid.UUID, set[str]] = defaultdict(set)
    for start in range(0, len(event_ids), 1_000):
        rows = session.execute(
            select(
                FeedbackEvent.domain_id,
                FeedbackEvent.kind,
                FeedbackEvent.value,
                FeedbackEvent.interaction_id,
                FeedbackEvent.messages,
                Interaction.messages,
            )
            .outerjoin(Interaction, Interaction.id == FeedbackEvent.interaction_id)
            .where(
                FeedbackEvent.tenant_id == tenant_id,
                FeedbackEvent.id.in_(event_ids[start : start + 1_000]),
            )
        )
        for domain_id, kind, value, interaction_id, own, of in rows:
            prompt = event_prompt(kind, value, interaction_id, own, of)
            if prompt is not None:
                found[domain_id].add(orjson.dumps(prompt).decode())
    return dict(found)


def prompt_json(prompt: Any) -> str:
    """A conversation's key on SQLite: its JSON with sorted keys."""
    return orjson.dumps(prompt, option=orjson.OPT_SORT_KEYS).decode()


def _scoped_events(session: Session, scope: Scope) -> list[_Event]:
    events = list(_events(session, scope))
    if scope.prompts is not None:
        touched = {prompt_json(orjson.loads(prompt)) for prompt in scope.prompts}
    elif scope.since is not None:
        since = _micros(scope.since)
        touched = {event.prompt_json for event in events if event.micros > since}
    else:
        return events
    return [event for event in events if event.prompt_json in touched]


def _python_rows(session: Session, scope: Scope) -> list[Row]:
    events = _scoped_events(session, scope)
    rows = [
        *_score_rows([e for e in events if e.kind in ("rating", "outcome")]),
        *_correction_rows([e for e in events if e.kind == "correction"]),
        *_comparison_rows([e for e in events if e.kind == "comparison"]),
    ]
    rows.sort(key=lambda row: row[0])
    return rows


def _quarters(event: _Event) -> int:
    value = event.value
    if event.kind == "outcome":
        return 4 if value["success"] else 0
    if "thumbs" in value:
        return 4 if value["thumbs"] == "up" else 0
    return int(value["stars"]) - 1


def _latest_by(events: list[_Event], key: Any, order: Any) -> list[_Event]:
    """Each `key`'s latest event by `order` (the SQL's DISTINCT ON / max)."""
    latest: dict[Any, _Event] = {}
    for event in events:
        found = latest.get(key(event))
        if found is None or order(event) > order(found):
            latest[key(event)] = event
    return list(latest.values())


def _target(event: _Event) -> tuple[str, str | None, str | None]:
    """What a rating, outcome or correction is about: its interaction, or its own context."""
    if event.interaction_id is not None:
        return (event.prompt_json, event.interaction_id, None)
    return (event.prompt_json, None, event.response)


def _refs(target: tuple[str, str | None, str | None], events: list[_Event]) -> list[str]:
    if target[1] is not None:
        return [f"interaction/{target[1]}"]
    return sorted(f"event/{event.id}" for event in events)[:MAX_REFS]


def _rater_key(event: _Event) -> str:
    if event.rater is not None:
        return event.rater
    return "" if event.kind == "outcome" else event.id


def _voter(event: _Event) -> str:
    return event.id if event.rater is None else event.rater


def _score_rows(events: list[_Event]) -> Iterator[Row]:
    """Like the SQL: each rater's latest score, and (for provenance) their first event id."""
    by_rater: dict[Any, list[_Event]] = defaultdict(list)
    for event in events:
        by_rater[_target(event), event.kind, _rater_key(event)].append(event)
    by_target: dict[Any, list[tuple[_Event, str]]] = defaultdict(list)
    for (target, _, _), rated in by_rater.items():
        latest = max(rated, key=lambda e: (e.micros, _quarters(e)))
        by_target[target].append((latest, min(event.id for event in rated)))
    for target, group in by_target.items():
        bits = 0
        for event, _ in group:
            bits |= 1 if event.kind == "rating" else 2
        refs = (
            [f"interaction/{target[1]}"]
            if target[1] is not None
            else (sorted(f"event/{ref}" for _, ref in group)[:MAX_REFS])
        )
        yield (
            target[0],
            target[0],
            SCORE,
            group[0][0].response,
            None,
            len(group),
            sum(_quarters(event) for event, _ in group),
            max(event.micros for event, _ in group),
            bits,
            refs,
        )


def _correction_rows(events: list[_Event]) -> Iterator[Row]:
    latest = _latest_by(
        events, key=lambda e: (_target(e), _voter(e)), order=lambda e: (e.micros, e.id)
    )
    by_fix: dict[Any, list[_Event]] = defaultdict(list)
    for event in latest:
        fixed = encode(event.value.get("text"), event.value.get("tool_calls"), event.tools)
        by_fix[_target(event), fixed].append(event)
    for (target, fixed), group in by_fix.items():
        newest = max(event.micros for event in group)
        refs = _refs(target, group)
        yield (
            target[0],
            target[0],
            CORRECTION,
            group[0].response,
            fixed,
            len(group),
            0,
            newest,
            0,
            refs,
        )


def _comparison_rows(events: list[_Event]) -> Iterator[Row]:
    latest = _latest_by(
        events,
        key=lambda e: (e.prompt_json, tuple(e.value["responses"]), _voter(e)),
        order=lambda e: (e.micros, e.id),
    )
    pairs: dict[tuple[str, str, str], list[_Event]] = defaultdict(list)
    ties: dict[str, int] = defaultdict(int)
    for event in latest:
        preferred, responses = event.value.get("preferred"), event.value["responses"]
        if preferred is None:
            ties[event.prompt_json] += bool(event.value.get("tie"))
            continue
        for position, rejected in enumerate(responses):
            if position != preferred:
                pairs[event.prompt_json, responses[preferred], rejected].append(event)
    for (prompt, chosen, rejected), group in pairs.items():
        refs = sorted(f"event/{event.id}" for event in group)[:MAX_REFS]
        newest = max(event.micros for event in group)
        yield (prompt, prompt, COMPARISON, chosen, rejected, len(group), 0, newest, 0, refs)
    for prompt, count in ties.items():
        yield (prompt, prompt, TIES, None, None, count, 0, 0, 0, None)

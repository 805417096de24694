"""A child process that finds the PII spans of a domain's texts ahead of the compiler.

Run by `flywheel.signals.compile.prefetch` as `python -m flywheel.signals.spans_ahead`: it
reads one JSON line on stdin (`{"dsn", "tenant", "domain", "limit"}`), then reads the domain's
texts on a connection of its own (the conversations and responses of the interactions with
feedback, the corrections' texts and the comparisons' responses), finds each distinct text's
spans once (`find_spans`, the expensive part of redaction) and writes them to stdout as JSON
lines, each a batch of `[digest, [[start, end, kind], ...]]` (`digest`: `text_digest` in hex).

A separate process, not a thread: finding spans is Python that holds the interpreter lock, so
only a process runs it beside the compiler's own work on a second core. Module kept light
(no SQLAlchemy): it starts while the compile's query runs.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from typing import Any

import orjson
import psycopg

from flywheel.redaction import find_spans, warm
from flywheel.signals.message_texts import map_texts

FETCH_ROWS = 2_000
BATCH = 500
# The texts of the interactions with feedback (the gateway records every call, and most get
# none) and of the corrections and comparisons, in the order the compiler needs them: by the
# prompt key its evidence query sorts by (`compile.evidence`), so this stays ahead of it.
TEXTS_SQL = """
SELECT t.messages, t.text, t.more FROM (
    SELECT jsonb_hash_extended(i.messages, 0) AS key, i.messages::text AS messages,
           i.response AS text, NULL::jsonb AS more
    FROM interactions i
    WHERE i.tenant_id = %(tenant)s AND i.domain_id = %(domain)s
      AND EXISTS (SELECT 1 FROM feedback_events e WHERE e.interaction_id = i.id)
    UNION ALL
    SELECT jsonb_hash_extended(coalesce(e.value -> 'messages', e.messages,
               (SELECT i.messages FROM interactions i WHERE i.id = e.interaction_id)), 0),
           NULL::text, CASE WHEN e.kind = 'correction' THEN e.value ->> 'text' END,
           CASE WHEN e.kind = 'comparison' THEN e.value -> 'responses' END
    FROM feedback_events e
    WHERE e.tenant_id = %(tenant)s AND e.domain_id = %(domain)s
      AND e.kind IN ('correction', 'comparison')
) t
ORDER BY t.key
"""


def text_digest(raw: str) -> bytes:
    """What a text is known by between the processes (16 bytes of BLAKE2b: no collision in
    any number of texts a compile reads)."""
    return hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def row_texts(messages_json: str | None, text: str | None, more: Any) -> Iterator[str]:
    """The texts of a row: every text of a conversation (as `items._prompt` redacts them), a
    response or correction, a comparison's responses."""
    if messages_json is not None:
        seen: list[str] = []

        def collect(raw: str) -> str:
            seen.append(raw)
            return raw

        for message in orjson.loads(messages_json):
            if isinstance(message, dict):
                map_texts(message, collect)
        yield from seen
    if text is not None:
        yield text
    if isinstance(more, list):
        yield from (item for item in more if isinstance(item, str))


def find_ahead(connection: psycopg.Connection[Any], params: dict[str, Any], limit: int) -> None:
    """Write the spans of the domain's distinct texts to stdout, up to `limit` texts."""
    done: set[bytes] = set()
    batch: list[tuple[str, list[Any]]] = []
    with connection.cursor(name="compile_spans_ahead") as cursor:
        cursor.itersize = FETCH_ROWS
        cursor.execute(TEXTS_SQL, params)
        for row in cursor:
            for raw in row_texts(*row):
                digest = text_digest(raw)
                if digest in done:
                    continue
                if len(done) >= limit:
                    _write(batch)
                    return
                done.add(digest)
                batch.append((digest.hex(), [list(span) for span in find_spans(raw)]))
                if len(batch) >= BATCH:
                    _write(batch)
    _write(batch)


def _write(batch: list[tuple[str, list[Any]]]) -> None:
    if batch:
        sys.stdout.buffer.write(orjson.dumps(batch) + b"\n")
        sys.stdout.buffer.flush()
        batch.clear()


def main() -> int:
    asked = orjson.loads(sys.stdin.buffer.readline())
    warm()
    params = {"tenant": asked["tenant"], "domain": asked["domain"]}
    try:
        with psycopg.connect(asked["dsn"], autocommit=False) as connection:
            connection.read_only = True
            find_ahead(connection, params, int(asked["limit"]))
    except BrokenPipeError:  # the compile is over: what was left is not needed
        return 0
    except psycopg.Error as error:
        print(f"spans ahead stopped: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

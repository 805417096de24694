"""Synthetic Zendesk exports for ticket-ingest benchmarks (and the streaming tests).

`write_zendesk_export(path, n_tickets, seed=0)` writes `{"tickets": [...]}` in the shape
`ingest.tickets.zendesk` reads (comments, sideloaded users, audits), streaming ticket by
ticket so a 100k-ticket file costs no more memory than a 10-ticket one. The mix, per 100:
about 55 solved (a third of them rated), 12 reopened and solved with a different answer,
5 reopened by a customer's "thanks" and solved again with the same answer, 8 escalated,
20 unresolved. Bodies mix HTML and plain text, quoted reply chains, signatures, and PII
(emails, phone numbers) for the redaction pass to find.

    python -m bench.ticket_corpus out.json 100000 [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

CUSTOMERS = (
    "Zoë Müller",
    "王芳",
    "José Álvarez",
    "Ingrid Øvrebø",
    "Amara Okafor",
    "Łukasz Nowak",
    "佐藤 愛子",
    "Dmitri Ivanov",
    "Chloé Dubois",
    "Ahmed Hassan",
)
AGENTS = ("Kenji Tanaka", "Anna Kowalska", "Priya Raman", "Marcus Lindqvist", "Sofia Rossi")
PROBLEMS = (
    (
        "Invoice shows the wrong VAT rate",
        "The invoice for {month} shows 19% VAT but we are exempt.",
    ),
    ("Login loop after password reset", "After resetting my password I am sent back to login."),
    ("Export is empty", "The CSV export of my {month} report downloads as an empty file."),
    ("Sync stopped", "Our Salesforce sync stops after a few minutes since the upgrade."),
    ("Charged twice", "I was charged twice for {month} (2 x 49.00 EUR)."),
    ("Webhook delays", "Webhooks arrive more than 10 minutes late since yesterday."),
    ("Cannot invite admin", "The invite button is greyed out when I pick the admin role."),
    ("API returns 500", "POST /v2/exports returns HTTP 500 for more than 1,000 rows."),
)
FIRST_ANSWERS = (
    "Please clear your browser cache and try again.",
    "Could you try another browser and let us know?",
    "Please reconnect the integration from Settings > Integrations.",
    "This should resolve itself within 24 hours.",
)
FINAL_ANSWERS = (
    "I enabled the tax exemption on your billing profile and re-issued the invoice.",
    "Your account had a stale two-factor session; I reset it, please sign in again.",
    "Exports over 50 MB were cut off by a proxy timeout; we raised the limit.",
    "Set the sync concurrency to 2 as described in https://docs.acme.example/sync.",
    "We refunded the duplicate charge; it shows on your statement in 3-5 days.",
    "A queue backlog delayed webhooks; it is drained and deliveries are on time again.",
    "Your plan allows one admin; upgrade to Team in Settings > Billing to add more.",
    "We fixed a timeout in the export service; full exports work again.",
)
MONTHS = ("January", "February", "March", "April", "May", "June")
START = datetime(2024, 1, 1, tzinfo=UTC)


def write_zendesk_export(path: Path, n_tickets: int, seed: int = 0) -> None:
    """Write `n_tickets` synthetic tickets to `path`, deterministic for a seed."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as out:
        out.write('{"tickets": [\n')
        for number in range(n_tickets):
            if number:
                out.write(",\n")
            out.write(json.dumps(_ticket(rng, 100_000 + number), ensure_ascii=False))
        out.write(f'\n], "next_page": null, "count": {n_tickets}}}\n')


def _ticket(rng: random.Random, ticket_id: int) -> dict[str, Any]:
    kind = rng.choices(
        ("solved", "reopened", "thanks", "escalated", "open"), weights=(55, 12, 5, 8, 20)
    )[0]
    customer = {"id": ticket_id * 10 + 1, "name": rng.choice(CUSTOMERS), "role": "end-user"}
    agent = {"id": 500 + rng.randrange(len(AGENTS)), "role": "agent"}
    agent["name"] = AGENTS[agent["id"] - 500]
    subject, problem = rng.choice(PROBLEMS)
    clock = _Clock(START + timedelta(minutes=ticket_id % 200_000))
    comments = [_comment(clock, customer, _problem(rng, problem, customer["name"]), rng)]
    audits: list[dict[str, Any]] = []
    if kind in ("reopened", "escalated"):
        comments.append(_comment(clock, agent, rng.choice(FIRST_ANSWERS), rng))
        if kind == "reopened":
            audits += [_status(clock, "open", "solved"), _status(clock, "solved", "open")]
        comments.append(_comment(clock, customer, _quoted_reply(comments[-1]), rng))
        if kind == "escalated":
            audits.append(_audit(clock, "tags", ["support"], ["support", "escalated"]))
    if kind != "open":
        comments.append(_comment(clock, agent, rng.choice(FINAL_ANSWERS) + _signature(agent), rng))
        audits.append(_status(clock, "open", "solved"))
    if kind == "thanks":
        comments.append(_comment(clock, customer, "Thanks, that worked!", rng))
        audits += [_status(clock, "solved", "open"), _status(clock, "open", "solved")]
    return {
        "id": ticket_id,
        "subject": subject,
        "status": "open" if kind == "open" else rng.choice(("solved", "closed")),
        "requester_id": customer["id"],
        "assignee_id": agent["id"],
        "tags": ["support", "escalated"] if kind == "escalated" else ["support"],
        "satisfaction_rating": _rating(rng) if kind == "solved" else None,
        "created_at": comments[0]["created_at"],
        "comments": comments,
        "users": [customer, agent],
        "audits": audits,
    }


class _Clock:
    """Timestamps that advance with every comment and audit of a ticket."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def tick(self) -> str:
        self.now += timedelta(minutes=37)
        return self.now.isoformat().replace("+00:00", "Z")


def _problem(rng: random.Random, problem: str, name: str) -> str:
    text = problem.format(month=rng.choice(MONTHS))
    contact = f"You can reach me at user{rng.randrange(10_000)}@example.com"
    contact += f" or +49 30 {rng.randrange(1_000_000, 9_999_999)}."
    return f"Hello,\n\n{text}\n{contact}\n\nBest regards,\n{name}"


def _quoted_reply(previous: dict[str, Any]) -> str:
    quoted = "\n".join(f"> {line}" for line in previous["body"].split("\n"))
    header = "On Mon, 4 Mar 2024 at 10:02, Acme Support <support@acme.example> wrote:"
    return f"That did not help, it still fails.\n\n{header}\n{quoted}\n\nSent from my iPhone"


def _signature(agent: dict[str, Any]) -> str:
    return f"\n\n-- \n{agent['name']}\nAcme Support | +1 555 0100"


def _comment(
    clock: _Clock, author: dict[str, Any], body: str, rng: random.Random
) -> dict[str, Any]:
    comment: dict[str, Any] = {
        "id": rng.randrange(10**9, 10**10),
        "author_id": author["id"],
        "public": True,
        "body": body,
        "created_at": clock.tick(),
        "attachments": [],
    }
    if rng.random() < 0.4:
        paragraphs = "".join(f"<p>{part}</p>" for part in body.split("\n\n"))
        comment["html_body"] = (
            f'<div class="zd-comment">{paragraphs.replace(chr(10), "<br>")}</div>'
        )
    return comment


def _status(clock: _Clock, previous: str, value: str) -> dict[str, Any]:
    return _audit(clock, "status", previous, value)


def _audit(clock: _Clock, field: str, previous: Any, value: Any) -> dict[str, Any]:
    event = {"type": "Change", "field_name": field, "previous_value": previous, "value": value}
    return {"created_at": clock.tick(), "events": [event]}


def _rating(rng: random.Random) -> dict[str, Any] | None:
    roll = rng.random()
    if roll < 0.25:
        return {"score": "good", "comment": "Great, thanks!"}
    if roll < 0.33:
        return {"score": "bad", "comment": "Took too long."}
    return {"score": "offered"} if roll < 0.5 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("n_tickets", type=int)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_zendesk_export(args.path, args.n_tickets, args.seed)
    print(f"wrote {args.n_tickets} tickets to {args.path} ({args.path.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()

"""Measure: does mixing another domain's items into a build put the eval set's prompts in train?

    python -m bench.mix_leak [--questions 1265]

The issue-15 scenario: "billing" and "billing-eu" ask the same short questions and answer them
their own way (one ticket per question, so one group each). billing-eu is built, then billing
with `--mix billing-eu=1.0`. The script counts billing's train rows whose user turn is one of
billing's eval questions, computed here from the rows themselves (not from the builder's
prompt keys), and prints the version's `contaminated` stats. In a scratch PostgreSQL database
(created and dropped here; FLYWHEEL_TEST_POSTGRES_URL as the tests). Asserts nothing.

Measured 2026-12-01 (1,265 questions; the split follows the random domain ids, so counts
move a little per run): before prompt keys (ec6d48b), 97 of 2,307 train rows on an eval
question with `contaminated: {}`; after, 0 of 2,038 and 0 of 2,062, with
`contaminated: {"prompt_key": 232}` and `{"prompt_key": 221}`.
"""

from __future__ import annotations

import argparse
import itertools
import uuid
from typing import Any

from sqlalchemy import select

from flywheel import migrate
from flywheel.datasets.membership import version_members
from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.db import make_engine, make_session_factory, unit_of_work
from flywheel.models import SftExample
from flywheel.settings import Settings
from flywheel.signals.candidates import Provenance, SftCandidate
from flywheel.signals.store import store_candidates
from flywheel.tenancy import service as tenancy
from tests.conftest import create_postgres_database, drop_postgres_database

VERBS = ["pay", "cancel", "renew", "split", "refund", "move", "close", "open", "change",
         "export", "share", "merge"]  # fmt: skip
THINGS = ["invoice", "plan", "card", "order", "account", "seat", "bill", "quote", "receipt",
          "team", "login", "address"]  # fmt: skip
ENDINGS = ["", " today", " now", " online", " again", " please", " myself", " quickly", " here"]


def questions(count: int) -> list[str]:
    every = (f"how do I {v} my {t}{e}?" for v, t, e in itertools.product(VERBS, THINGS, ENDINGS))
    return list(itertools.islice(every, count))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=1265)
    asked = questions(parser.parse_args().questions)
    url = create_postgres_database()
    try:
        migrate.upgrade(url)
        sessions = make_session_factory(make_engine(Settings(database_url=url)))
        with unit_of_work(sessions) as session:
            tenant = tenancy.create_tenant(session=session, name="acme")
            ids = {}
            for name in ("billing", "billing-eu"):
                ids[name] = domain = tenancy.create_domain(
                    session=session, tenant=tenant, name=name
                ).id
                candidates = [
                    SftCandidate(
                        Provenance("ticket", f"{name}-{n}", f"{name}-{n}"),
                        [{"role": "user", "content": question}],
                        f"{name}'s answer to {question} (#{n})",
                    )
                    for n, question in enumerate(asked)
                ]
                store_candidates(
                    session=session, tenant_id=tenant.id, domain_id=domain,
                    candidates=candidates, ingestor_version="bench",
                )  # fmt: skip
        with unit_of_work(sessions) as session:
            build_dataset_version(
                session=session, tenant_id=tenant.id, domain_id=ids["billing-eu"],
                recipe=DatasetRecipe(),
            )  # fmt: skip
            built = build_dataset_version(
                session=session, tenant_id=tenant.id, domain_id=ids["billing"],
                recipe=DatasetRecipe(mix={"billing-eu": 1.0}),
            )  # fmt: skip
            held = version_members(session, built.version)
            messages_of: dict[uuid.UUID, Any] = dict(
                session.execute(
                    select(SftExample.id, SftExample.messages).where(
                        SftExample.id.in_([item.item_id for item in held])
                    )
                ).all()
            )
            rows = [(item.split, messages_of[item.item_id]) for item in held]
        evaluated = {messages[-1]["content"] for split, messages in rows if split == "eval"}
        train = [messages[-1]["content"] for split, messages in rows if split == "train"]
        leaked = sum(question in evaluated for question in train)
        print(f"{len(asked)} questions per domain; billing v{built.version.version}: "
              f"{len(train)} train rows, {len(evaluated)} eval questions; train rows on an eval "
              f"question: {leaked}; contaminated: {built.stats.get('contaminated')}")  # fmt: skip
    finally:
        drop_postgres_database(url)


if __name__ == "__main__":
    main()

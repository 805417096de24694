"""Mixing: another domain's train items join a build by share, never its eval items; source
weights scale or drop a source; both are recorded in the version's recipe and manifest."""

from __future__ import annotations

import json
import random
import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.membership import prompt_keys, stored_manifest, version_members
from flywheel.datasets.models import DatasetVersion
from flywheel.datasets.service import Built, DatasetRecipe, build_dataset_version
from flywheel.datasets.split import Split
from flywheel.db import unit_of_work
from flywheel.errors import InvalidInput
from flywheel.models import Domain, SftExample, Tenant
from flywheel.signals.candidates import Provenance, SftCandidate
from flywheel.signals.store import store_candidates
from flywheel.tenancy import service as tenancy
from tests.conftest import Caller, run_cli

RECIPE = DatasetRecipe(eval_fraction=0.3, replay_fraction=0.0)
VOCABULARY = [
    f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "pe", "ra", "si", "tu") for b in "aeiouxyz"
]


def words(seed: str) -> str:
    """Ten words no other item shares many of (so nothing here is a near-duplicate)."""
    chooser = random.Random(seed)
    return " ".join(chooser.choice(VOCABULARY) for _ in range(10))


def add_domain(sessions: sessionmaker[Session], caller: Caller, name: str) -> uuid.UUID:
    with unit_of_work(sessions) as session:
        tenant = session.get_one(Tenant, caller.tenant_id)
        return tenancy.create_domain(session=session, tenant=tenant, name=name).id


def domain_id(sessions: sessionmaker[Session], caller: Caller, name: str) -> uuid.UUID:
    with sessions() as session:
        return session.scalars(
            select(Domain.id).where(Domain.tenant_id == caller.tenant_id, Domain.name == name)
        ).one()


def store(
    sessions: sessionmaker[Session], caller: Caller, domain: uuid.UUID, source: str, count: int
) -> None:
    with unit_of_work(sessions) as session:
        store_candidates(
            session=session,
            tenant_id=caller.tenant_id,
            domain_id=domain,
            candidates=[
                SftCandidate(
                    Provenance(source, f"{source}-{domain}-{n}", f"{source}-{n}"),
                    [{"role": "user", "content": words(f"{source}{domain}{n}")}],
                    words(f"answer{source}{domain}{n}"),
                )
                for n in range(count)
            ],
            ingestor_version="test",
        )


def build(
    sessions: sessionmaker[Session], caller: Caller, domain: uuid.UUID, recipe: DatasetRecipe
) -> Built:
    with unit_of_work(sessions) as session:
        return build_dataset_version(
            session=session, tenant_id=caller.tenant_id, domain_id=domain, recipe=recipe
        )


def split_items(
    sessions: sessionmaker[Session], version_id: uuid.UUID
) -> dict[str, dict[uuid.UUID, float]]:
    with sessions() as session:
        version = session.get_one(DatasetVersion, version_id)
        held = version_members(session, version)
        assert stored_manifest(session, version) == version.manifest_sha256
    found: dict[str, dict[uuid.UUID, float]] = {"train": {}, "eval": {}}
    for item in held:
        assert item.kind == "sft"
        found[item.split][item.item_id] = item.weight
    return found


def items_of(sessions: sessionmaker[Session], domain: uuid.UUID) -> set[uuid.UUID]:
    with sessions() as session:
        return set(session.scalars(select(SftExample.id).where(SftExample.domain_id == domain)))


def test_a_mixed_build_takes_only_the_other_domains_train_items(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    billing = domain_id(sessions, acme, "billing")
    support = add_domain(sessions, acme, "support")
    store(sessions, acme, billing, "ticket", 20)
    store(sessions, acme, support, "ticket", 60)
    with pytest.raises(InvalidInput, match="before it has a dataset version"):
        build(sessions, acme, billing, DatasetRecipe(mix={"support": 1.0}))
    theirs = split_items(sessions, build(sessions, acme, support, RECIPE).version.id)

    whole = build(sessions, acme, billing, DatasetRecipe(eval_fraction=0.3, mix={"support": 1.0}))
    half = build(sessions, acme, billing, DatasetRecipe(eval_fraction=0.3, mix={"support": 0.5}))

    mixed = split_items(sessions, whole.version.id)
    from_support = set(mixed["train"]) & items_of(sessions, support)
    assert from_support == set(theirs["train"])  # all of its train, none of its eval
    assert not set(mixed["eval"]) & items_of(sessions, support)  # our eval stays our own
    assert whole.stats["mixed"] == {"support": len(theirs["train"])}
    assert whole.version.recipe["mix"] == {"support": 1.0}
    # half the share draws about half of the items (already trained on: replayed at 25%)
    assert 0.25 < half.stats["mixed"]["support"] / len(from_support) < 0.75
    share = set(split_items(sessions, half.version.id)["train"]) & items_of(sessions, support)
    assert share < from_support
    # the same mix again, with nothing new, is the same version
    again = build(sessions, acme, billing, DatasetRecipe(eval_fraction=0.3, mix={"support": 0.5}))
    assert not again.is_new
    assert again.version.id == half.version.id


def test_source_weights_scale_and_drop_train_items(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    billing = domain_id(sessions, acme, "billing")
    store(sessions, acme, billing, "ticket", 20)
    store(sessions, acme, billing, "task_file", 20)
    tickets = {
        item
        for item in items_of(sessions, billing)
        if item in _ids_by_source(sessions, billing, "ticket")
    }

    halved = build(
        sessions, acme, billing, DatasetRecipe(replay_fraction=1.0, source_weights={"ticket": 0.5})
    )
    dropped = build(
        sessions, acme, billing, DatasetRecipe(replay_fraction=1.0, source_weights={"ticket": 0.0})
    )

    weights = split_items(sessions, halved.version.id)["train"]
    assert {weights[item] for item in weights if item in tickets} == {0.5}
    assert {weights[item] for item in weights if item not in tickets} == {1.0}
    train = split_items(sessions, dropped.version.id)["train"]
    assert not set(train) & tickets
    assert dropped.stats["source_weighted_out"] == len(set(weights) & tickets)
    assert dropped.version.manifest_sha256 != halved.version.manifest_sha256


def _ids_by_source(
    sessions: sessionmaker[Session], domain: uuid.UUID, source: str
) -> set[uuid.UUID]:
    with sessions() as session:
        return set(
            session.scalars(
                select(SftExample.id).where(
                    SftExample.domain_id == domain, SftExample.source_kind == source
                )
            )
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--mix", "nowhere=0.5"), "no such domain"),
        (("--mix", "billing=0.5"), "the one being built"),
        (("--mix", "support"), "NAME=NUMBER"),
        (("--mix", "support=2"), "(0, 1]"),
        (("--mix", "support=0"), "(0, 1]"),
        (("--source-weight", "ticket=-1"), ">= 0"),
        (("--source-weight", "email=1"), "unknown source kind"),
    ],
)
def test_bad_mixes_are_refused_in_one_line(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    message: str,
) -> None:
    code, out, err = run_cli(capsys, "dataset", "build", "--domain", "billing", *args)
    assert code != 0
    assert out == ""
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_the_cli_records_the_mix(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    sessions = on_test_database
    support = add_domain(sessions, acme, "support")
    store(sessions, acme, support, "ticket", 10)
    store(sessions, acme, domain_id(sessions, acme, "billing"), "ticket", 10)
    assert run_cli(capsys, "dataset", "build", "--domain", "support")[0] == 0
    code, out, _ = run_cli(
        capsys,
        "dataset",
        "build",
        "--domain",
        "billing",
        "--mix",
        "support=1",
        "--source-weight",
        "ticket=2",
        "--json",
    )
    assert code == 0
    recipe = json.loads(out)["recipe"]
    assert (recipe["mix"], recipe["source_weights"]) == ({"support": 1.0}, {"ticket": 2.0})


QUESTIONS = [f"how do I {verb} my {thing}?" for verb in ("pay", "cancel", "renew", "split",
             "refund", "move") for thing in ("invoice", "plan", "card", "order", "account",
             "seat", "bill", "quote")]  # fmt: skip


def store_questions(
    sessions: sessionmaker[Session], caller: Caller, domain: uuid.UUID, answer: str
) -> None:
    """One short question per group (a ticket each), answered the domain's own way."""
    with unit_of_work(sessions) as session:
        store_candidates(
            session=session,
            tenant_id=caller.tenant_id,
            domain_id=domain,
            candidates=[
                SftCandidate(
                    Provenance("ticket", f"{answer}-{n}", f"{answer}-ticket-{n}"),
                    [{"role": "system", "content": answer}, {"role": "user", "content": q}],
                    f"{answer}: {words(answer + q)}",
                )
                for n, q in enumerate(QUESTIONS)
            ],
            ingestor_version="test",
        )


def keys(sessions: sessionmaker[Session], version_id: uuid.UUID, split: Split) -> set[str]:
    with sessions() as session:
        return prompt_keys(session, [version_id], split)


def test_a_mix_of_the_same_prompts_never_puts_an_eval_prompt_in_train(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    """billing and billing-eu ask the same short questions and answer them differently: mixed
    in, billing-eu's answers to billing's eval questions would teach billing its eval set."""
    billing = domain_id(sessions, acme, "billing")
    eu = add_domain(sessions, acme, "billing-eu")
    store_questions(sessions, acme, billing, "billing")
    store_questions(sessions, acme, eu, "billing-eu")
    build(sessions, acme, eu, RECIPE)

    built = build(sessions, acme, billing, DatasetRecipe(eval_fraction=0.3, mix={"billing-eu": 1}))

    evaluated = keys(sessions, built.version.id, "eval")
    assert evaluated
    assert not keys(sessions, built.version.id, "train") & evaluated
    assert built.stats["contaminated"]["prompt_key"] >= len(evaluated) * 0.5
    assert built.stats["mixed"]["billing-eu"] > 0  # its other questions still join train


def test_a_new_eval_item_on_a_prompt_trained_earlier_is_withheld(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    """Week 1 trains on a question; week 2 brings the same question in a new thread that the
    split puts in eval: scoring week 1's model on it would score what it saw."""
    billing = domain_id(sessions, acme, "billing")
    store_questions(sessions, acme, billing, "week-1")
    first = build(sessions, acme, billing, RECIPE)
    trained = keys(sessions, first.version.id, "train")
    store_questions(sessions, acme, billing, "week-2")  # new groups, the same questions

    second = build(sessions, acme, billing, RECIPE)

    assert second.stats["withheld_from_eval"]["prompt_trained"] > 0
    assert not keys(sessions, second.version.id, "eval") & trained
    assert not keys(sessions, second.version.id, "train") & keys(
        sessions, second.version.id, "eval"
    )

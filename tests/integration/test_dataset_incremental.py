"""Incremental builds: a version built from what may have changed (`DomainRows.load_changing`),
the stored sketches and the kept eval index (in the process or the database) equals one
built from scratch (every item and member row read, no sketch stored, no index kept), byte
for byte in the manifest, in its stats and in the member rows it writes, whatever changed
since the last version, and version after version."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets import kept_index, overlap
from flywheel.datasets.items import Item
from flywheel.datasets.membership import stored_manifest, version_members
from flywheel.datasets.models import (
    SKETCHER,
    DatasetMember,
    DatasetVersion,
    EvalIndexPart,
    ItemSketch,
)
from flywheel.datasets.overlap import forget_indexes
from flywheel.datasets.service import Built, DatasetRecipe, build_dataset_version
from flywheel.models import Domain, SftExample
from flywheel.signals.candidates import Candidate
from tests.conftest import Caller
from tests.integration.test_dataset_build import domain_of, groups_in, sft, store

RECIPE = DatasetRecipe(eval_fraction=0.3, replay_fraction=0.5)


def text(number: int) -> str:
    words = ["invoice", "refund", "password", "account", "billing", "address", "charge", "plan"]
    return " ".join(f"{words[(number * 7 + i) % 8]}{number}x{i}" for i in range(16))


def base(sessions: sessionmaker[Session], caller: Caller) -> dict[str, list[str]]:
    """Eight train groups and three eval groups of two items each, and their first version."""
    domain_id = domain_of(sessions, caller)
    groups = {
        "train": list(groups_in("train", domain_id, 8)),
        "eval": list(groups_in("eval", domain_id, 3)),
    }
    keys = [group for split in groups.values() for group in split]
    store(sessions, caller, [sft(group, text(n)) for n, group in enumerate(keys * 2)])
    with sessions() as session:
        built = build(session, caller)
        session.commit()
    assert built.is_new
    return groups


def build(session: Session, caller: Caller, *, from_scratch: bool = False) -> Built:
    return build_dataset_version(
        session=session,
        tenant_id=caller.tenant_id,
        domain_id=domain_of_session(session, caller),
        recipe=RECIPE,
        from_scratch=from_scratch,
    )


def domain_of_session(session: Session, caller: Caller) -> uuid.UUID:
    return session.scalars(select(Domain.id).where(Domain.tenant_id == caller.tenant_id)).one()


def trained_text(sessions: sessionmaker[Session], groups: dict[str, list[str]]) -> str:
    with sessions() as session:
        messages = session.scalars(
            select(SftExample.messages).where(SftExample.group_key == groups["train"][0])
        ).first()
    assert messages is not None
    return str(messages[0]["content"])


def new_train(sessions: sessionmaker[Session], groups: dict[str, list[str]]) -> list[Candidate]:
    return [sft(groups["train"][1], text(500)), sft("brand-new-group", text(501))]


def new_eval(sessions: sessionmaker[Session], groups: dict[str, list[str]]) -> list[Candidate]:
    return [sft(groups["eval"][0], text(600))]


def eval_asks_trained(
    sessions: sessionmaker[Session], groups: dict[str, list[str]]
) -> list[Candidate]:
    asked = sft(groups["eval"][1], trained_text(sessions, groups))
    answered = replace(asked, completion="a different answer to the same question")
    return [answered, sft(groups["train"][4], text(800))]


def eval_quotes_trained(
    sessions: sessionmaker[Session], groups: dict[str, list[str]]
) -> list[Candidate]:
    """A new eval item quoting every train item: replayed ones must leave train."""
    with sessions() as session:
        trained = [str(m[0]["content"]) for m in session.scalars(select(SftExample.messages))]
    return [sft(groups["eval"][2], f"{quoted} and also more words") for quoted in trained[:6]]


def retract(sessions: sessionmaker[Session], groups: dict[str, list[str]]) -> list[Candidate]:
    with sessions() as session:
        for group in (groups["eval"][0], groups["train"][2]):
            first = session.scalars(select(SftExample.id).where(SftExample.group_key == group))
            session.execute(
                update(SftExample).where(SftExample.id == first.first()).values(weight=0.0)
            )
        session.commit()
    return [sft(groups["train"][3], text(700))]


def reweight(sessions: sessionmaker[Session], groups: dict[str, list[str]]) -> list[Candidate]:
    """Every item of an eval group and of two train groups weighs more: their held rows close
    and reopen with the new weight; the rest stay open as they were."""
    keys = [groups["eval"][1], groups["train"][5], groups["train"][6]]
    with sessions() as session:
        session.execute(update(SftExample).where(SftExample.group_key.in_(keys)).values(weight=2.5))
        session.commit()
    return [sft(groups["train"][7], text(900))]


def restore(sessions: sessionmaker[Session], groups: dict[str, list[str]]) -> list[Candidate]:
    """Items retracted before the last version weigh again: back as replay candidates."""
    with sessions() as session:
        session.execute(update(SftExample).where(SftExample.weight == 0).values(weight=1.0))
        session.commit()
    return [sft(groups["train"][0], text(950))]


def mixed(sessions: sessionmaker[Session], groups: dict[str, list[str]]) -> list[Candidate]:
    return [
        *new_train(sessions, groups),
        *new_eval(sessions, groups),
        *eval_asks_trained(sessions, groups),
        *eval_quotes_trained(sessions, groups),
        *retract(sessions, groups),
    ]


def shows(shape: str, stats: dict[str, Any], rows: dict[str, int]) -> bool:
    """Whether the build's stats show the change's effect (so the comparison means something)."""
    if shape == "eval_asks_trained":
        return bool(stats["withheld_from_eval"] == {"prompt_trained": 1})
    if shape in ("eval_quotes_trained", "mixed"):
        return bool(stats["contaminated"].get("ngram_overlap"))
    if shape == "reweight":
        return bool(rows["closed"] and rows["added"] > rows["closed"])
    if shape == "restore":
        return bool(stats["replayed"] and stats["new"] == 1)
    return bool(stats["new"] or stats["new_eval"])


Change = Callable[[sessionmaker[Session], dict[str, list[str]]], list[Candidate]]


@pytest.mark.parametrize(
    "change",
    [new_train, new_eval, eval_asks_trained, eval_quotes_trained, retract, reweight, mixed],
    ids=lambda change: change.__name__,
)
def test_an_incremental_build_equals_one_from_scratch(
    sessions: sessionmaker[Session], acme: Caller, change: Change
) -> None:
    groups = base(sessions, acme)
    store(sessions, acme, change(sessions, groups))
    with sessions() as session:
        kept = set(session.scalars(select(ItemSketch.id)))
        incremental = build(session, acme)
        assert incremental.is_new
        assert shows(change.__name__, incremental.stats, incremental.rows)
        sketched = set(session.scalars(select(ItemSketch.id)))
        assert stored_manifest(session, incremental.version) == incremental.version.manifest_sha256
        session.rollback()
    with sessions() as session:
        forget_indexes()
        session.execute(delete(ItemSketch))
        scratch = build(session, acme, from_scratch=True)
        assert outcome(scratch) == outcome(incremental)
        assert incremental.considered < scratch.considered  # it looked at less
        session.rollback()
    assert kept  # the first build sketched its items,
    assert kept < sketched  # and this one kept those sketches and sketched the new items


@pytest.mark.parametrize("fresh", [False, True], ids=["same process", "fresh process"])
@pytest.mark.parametrize("min_eval_items", [0, 40])
def test_a_chain_of_incremental_builds_equals_builds_from_scratch_at_every_version(
    sessions: sessionmaker[Session],
    acme: Caller,
    min_eval_items: int,
    fresh: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each version is built on the rows the incremental builds before it wrote: retracted
    items come back, reweighted ones change again, eval grows and quotes train; with a
    minimum eval size the eval set is short of, new groups fill eval first. In a fresh
    process each build's eval index comes from the kept parts, which grow, are replaced when
    an eval item was retracted, and are kept as one when they are many (here, three)."""
    monkeypatch.setattr(kept_index, "MAX_PARTS", 3)
    groups = base(sessions, acme)
    with sessions() as session:
        domain = session.get_one(Domain, domain_of_session(session, acme))
        domain.config = {**(domain.config or {}), "dataset": {"min_eval_items": min_eval_items}}
        session.commit()
    chain: list[Change] = [retract, new_eval, reweight, restore, eval_quotes_trained, new_train]
    for change in chain:
        store(sessions, acme, change(sessions, groups))
        with sessions() as session:
            scratch = build(session, acme, from_scratch=True)
            session.rollback()
        if fresh:
            forget_indexes()
        with sessions() as session:
            incremental = build(session, acme)
            assert outcome(incremental) == outcome(scratch), change.__name__
            assert incremental.considered < scratch.considered
            version = incremental.version
            assert stored_manifest(session, version) == version.manifest_sha256
            session.commit()
        assert shows(change.__name__, incremental.stats, incremental.rows), change.__name__


def test_a_build_in_a_fresh_process_extends_the_kept_eval_index(
    sessions: sessionmaker[Session], acme: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The eval index the last build kept in the database serves a build in another process
    (here, this one once it forgot its own): that build reads the sketch of the new eval
    item, not those of every eval item, keeps a part for the new item, and builds the
    version a build from scratch builds."""
    groups = base(sessions, acme)
    with sessions() as session:
        held = select(DatasetMember.sft_example_id).where(DatasetMember.split == "eval")
        evaluated = set(session.scalars(held))
    store(sessions, acme, new_eval(sessions, groups))
    read: list[uuid.UUID] = []

    def sketches_of(
        session: Session, items: Iterable[Item], n: int, known: dict[Any, Any] | None = None
    ) -> Any:
        items = list(items)
        read.extend(item.id for item in items if item.id not in (known or {}))
        return real_sketches_of(session, items, n, known)

    real_sketches_of = overlap.sketches_of
    monkeypatch.setattr(overlap, "sketches_of", sketches_of)
    forget_indexes()
    with sessions() as session:
        incremental = build(session, acme)
        parts = select(EvalIndexPart.item_count).order_by(EvalIndexPart.number)
        assert session.scalars(parts).all() == [len(evaluated), 1]
        session.rollback()
    assert incremental.stats["new_eval"] == 1
    assert read  # the new eval item's sketch,
    assert evaluated
    assert not evaluated & set(read)  # and none of the kept eval items'
    with sessions() as session:
        forget_indexes()
        assert outcome(build(session, acme, from_scratch=True)) == outcome(incremental)
        session.rollback()


def outcome(built: Built) -> tuple[Any, ...]:
    """What a build decided: the version's hashes, stats and the member rows it wrote."""
    version = built.version
    return built.is_new, version.manifest_sha256, version.eval_sha256, built.stats, built.rows


def test_a_build_replaces_the_stale_sketches_of_the_items_it_holds(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    """Sketches made by other rules are made again for every item the version holds (those
    of the undrawn replay candidates an incremental build does not read, when one is)."""
    groups = base(sessions, acme)
    with sessions() as session:
        session.execute(update(ItemSketch).values(sketcher=SKETCHER - 1, grams=b""))
        session.commit()
    store(sessions, acme, new_eval(sessions, groups))
    with sessions() as session:
        held = {item.item_id for item in version_members(session, build(session, acme).version)}
        stamps = session.execute(
            select(ItemSketch.sketcher, func.length(ItemSketch.grams)).where(
                ItemSketch.sft_example_id.in_(held)
            )
        )
        assert {(stamp, size > 0) for stamp, size in stamps} == {(SKETCHER, True)}


def test_the_first_build_under_new_sketch_rules_rebuilds_every_sketch(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    """After a version made by older sketch rules, a build re-sketches every item of the
    domain, not only those it reads: an item trained earlier and retracted since still keeps
    its prompt out of eval through its sketch. Later builds sketch only what they read."""
    groups = base(sessions, acme)
    with sessions() as session:
        session.execute(update(ItemSketch).values(sketcher=SKETCHER - 1, grams=b""))
        retracted = session.scalars(select(SftExample.id).limit(1)).one()
        session.execute(update(SftExample).where(SftExample.id == retracted).values(weight=0.0))
        version = session.scalars(select(DatasetVersion)).one()
        version.stats = {**version.stats, "sketcher": SKETCHER - 1}  # made by the older rules
        session.commit()
    store(sessions, acme, new_eval(sessions, groups))
    with sessions() as session:
        build(session, acme)
        stamps = session.execute(select(ItemSketch.sft_example_id, ItemSketch.sketcher))
        assert {stamp for _, stamp in stamps} == {SKETCHER}
        session.commit()

    with sessions() as session:  # one more version: only the items it reads are sketched
        session.execute(
            update(ItemSketch)
            .where(ItemSketch.sft_example_id == retracted)
            .values(sketcher=SKETCHER - 1)
        )
        session.commit()
    store(sessions, acme, [sft(groups["eval"][1], text(601))])
    with sessions() as session:
        assert build(session, acme).is_new
        stamp = session.scalars(
            select(ItemSketch.sketcher).where(ItemSketch.sft_example_id == retracted)
        ).one()
        assert stamp == SKETCHER - 1

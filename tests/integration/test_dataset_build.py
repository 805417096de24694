"""Dataset versions on a real database: eligibility, group-aware split, once eval always eval
across versions, replay, decontamination, and a manifest hash that only the inputs move."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import ARRAY, Text, cast, func, select, update
from sqlalchemy.dialects.postgresql import array
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.membership import is_drawn, sql_draw, stored_manifest, version_members
from flywheel.datasets.models import DatasetMember, DatasetVersion
from flywheel.datasets.service import Built, DatasetRecipe, build_dataset_version
from flywheel.datasets.split import hashed_split
from flywheel.db import unit_of_work
from flywheel.models import Domain, PreferencePair, SftExample, VerifiableTask
from flywheel.signals.candidates import (
    Candidate,
    PairCandidate,
    Provenance,
    SftCandidate,
    TaskCandidate,
)
from flywheel.signals.store import store_candidates
from tests.conftest import Caller, run_cli

RECIPE = DatasetRecipe(eval_fraction=0.3, replay_fraction=0.0)
EVAL_TEXT = (
    "please reset the billing address on my account because the invoice shows the old "
    "street and my accountant needs the corrected document before the end of the month"
)
WORDS = EVAL_TEXT.split()


def domain_of(sessions: sessionmaker[Session], caller: Caller) -> uuid.UUID:
    with sessions() as session:
        return session.scalars(select(Domain.id).where(Domain.tenant_id == caller.tenant_id)).one()


def groups_in(split: str, domain_id: uuid.UUID, count: int, prefix: str = "g") -> Iterator[str]:
    """Group keys the hash places in `split` (with RECIPE's eval fraction)."""
    number = 0
    found = 0
    while found < count:
        key = f"{prefix}-{number}"
        number += 1
        if hashed_split(domain_id, key, RECIPE.eval_fraction) == split:
            found += 1
            yield key


def sft(group: str, text: str) -> SftCandidate:
    return SftCandidate(
        Provenance("ticket", group, group), [{"role": "user", "content": text}], f"answer {text}"
    )


def store(sessions: sessionmaker[Session], caller: Caller, candidates: list[Candidate]) -> None:
    with unit_of_work(sessions) as session:
        store_candidates(
            session=session,
            tenant_id=caller.tenant_id,
            domain_id=domain_of(sessions, caller),
            candidates=candidates,
            ingestor_version="test",
        )


def build(sessions: sessionmaker[Session], caller: Caller, recipe: DatasetRecipe = RECIPE) -> Built:
    with unit_of_work(sessions) as session:
        return build_dataset_version(
            session=session,
            tenant_id=caller.tenant_id,
            domain_id=domain_of(sessions, caller),
            recipe=recipe,
        )


def members(sessions: sessionmaker[Session], version_id: uuid.UUID) -> dict[str, set[uuid.UUID]]:
    """What the version holds, split by split; checked against its manifest hash on the way."""
    with sessions() as session:
        version = session.get_one(DatasetVersion, version_id)
        held = version_members(session, version)
        assert stored_manifest(session, version) == version.manifest_sha256
    splits: dict[str, set[uuid.UUID]] = {"train": set(), "eval": set()}
    for item in held:
        splits[item.split].add(item.item_id)
    return splits


def ids_of(sessions: sessionmaker[Session], group_keys: set[str]) -> set[uuid.UUID]:
    with sessions() as session:
        return set(
            session.scalars(select(SftExample.id).where(SftExample.group_key.in_(group_keys)))
        )


def test_versions_keep_eval_frozen_and_groups_whole(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    domain_id = domain_of(sessions, acme)
    eval_groups = set(groups_in("eval", domain_id, 4))
    train_groups = set(groups_in("train", domain_id, 8))
    store(
        sessions,
        acme,
        [
            sft(group, f"{group} question {n}")
            for group in sorted(eval_groups | train_groups)
            for n in range(2)
        ],
    )

    first = build(sessions, acme)

    assert first.is_new
    assert first.version.version == 1
    v1 = members(sessions, first.version.id)
    assert v1["eval"] == ids_of(sessions, eval_groups)
    assert v1["train"] == ids_of(sessions, train_groups)
    assert first.stats["eval"] == {"sft": 8}
    assert first.stats["groups"] == {"eval": 4, "train": 8}

    again = build(sessions, acme)
    assert not again.is_new
    assert again.version.id == first.version.id

    later = set(groups_in("train", domain_id, 3, prefix="later"))
    store(sessions, acme, [sft(group, f"{group} new question") for group in sorted(later)])
    # A different eval fraction later must not move groups already placed.
    second = build(sessions, acme, DatasetRecipe(eval_fraction=0.9, replay_fraction=0.0))

    assert second.version.version == 2
    assert second.version.parent_id == first.version.id
    v2 = members(sessions, second.version.id)
    assert v1["eval"] <= v2["eval"]  # eval is append-only
    assert not v1["eval"] & v2["train"]  # once eval, never train
    assert not v1["train"] & v2["eval"]  # trained-on groups never become eval
    assert second.stats["new"] == len(v2["train"])  # replay 0: only new train items

    more_eval = set(groups_in("eval", domain_id, 2, prefix="third"))
    store(sessions, acme, [sft(group, f"{group} third question") for group in sorted(more_eval)])
    third = build(sessions, acme, DatasetRecipe(eval_fraction=0.3, replay_fraction=1.0))

    v3 = members(sessions, third.version.id)
    assert third.version.version == 3
    assert v1["eval"] | v2["eval"] | ids_of(sessions, more_eval) == v3["eval"]
    assert not (v1["eval"] | v2["eval"]) & v3["train"]
    assert v1["train"] | v2["train"] <= v3["train"]  # replay 1.0: every train item again
    assert third.version.eval_sha256 != second.version.eval_sha256  # the eval set's version


def test_only_eligible_items_go_in(sessions: sessionmaker[Session], acme: Caller) -> None:
    domain_id = domain_of(sessions, acme)
    (group,) = groups_in("train", domain_id, 1)
    provenance = Provenance("repository", "r", group)
    task = TaskCandidate(provenance, "def f():\n", "f", "def f():\n    return 1\n", "tests")
    pending = TaskCandidate(provenance, "def g():\n", "g", "def g():\n    return 1\n", "tests")
    retracted = PairCandidate(provenance, [{"role": "user", "content": "q"}], "a", "b", "why")
    store(sessions, acme, [task, pending, retracted, sft(group, "kept")])
    with unit_of_work(sessions) as session:
        session.execute(
            update(VerifiableTask)
            .where(VerifiableTask.entry_point == "f")
            .values(verifier_status="usable", difficulty=0.5)
        )
        session.execute(update(PreferencePair).values(weight=0.0))

    built = build(sessions, acme)

    assert built.stats["train"] == {"sft": 1, "task": 1}
    assert "pair" not in built.stats["train"]


def test_replay_brings_back_a_share_of_old_train_items(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    domain_id = domain_of(sessions, acme)
    groups = list(groups_in("train", domain_id, 40))
    store(sessions, acme, [sft(group, f"{group} text") for group in groups])
    first = build(sessions, acme)
    store(sessions, acme, [sft("new-group-x", "brand new")])

    everything = build(sessions, acme, DatasetRecipe(eval_fraction=0.3, replay_fraction=1.0))

    assert everything.stats["replayed"] == len(members(sessions, first.version.id)["train"])


def test_train_items_overlapping_eval_are_excluded_and_counted(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    domain_id = domain_of(sessions, acme)
    (eval_group,) = groups_in("eval", domain_id, 1)
    train_groups = list(groups_in("train", domain_id, 3))
    copied = " ".join(WORDS[2:15])  # 13 words of the eval item
    store(
        sessions,
        acme,
        [
            sft(eval_group, " ".join(WORDS)),
            sft(train_groups[0], f"an unrelated opening, then {copied}, and more words after"),
            sft(train_groups[1], "what are your opening hours on public holidays in december"),
            sft(train_groups[2], " ".join(WORDS[2:14]) + " unrelated ending"),  # only 12 words
        ],
    )

    built = build(sessions, acme)

    assert built.stats["contaminated"] == {"ngram_overlap": 1}
    assert built.stats["train"] == {"sft": 2}
    # the excluded item is not new signal: building again changes nothing
    again = build(sessions, acme, DatasetRecipe(eval_fraction=0.3, replay_fraction=0.5))
    assert (again.is_new, again.version.id) == (False, built.version.id)


def test_the_manifest_moves_only_with_the_inputs(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    domain_id = domain_of(sessions, acme)
    store(sessions, acme, [sft(group, f"{group} q") for group in groups_in("train", domain_id, 5)])

    def manifest(recipe: DatasetRecipe) -> str:
        with sessions() as session:  # built and rolled back: nothing stays
            built = build_dataset_version(
                session=session, tenant_id=acme.tenant_id, domain_id=domain_id, recipe=recipe
            )
            session.rollback()
            return built.version.manifest_sha256

    assert manifest(RECIPE) == manifest(RECIPE)
    assert manifest(RECIPE) != manifest(DatasetRecipe(eval_fraction=0.3, replay_fraction=0.5))
    before = manifest(RECIPE)
    store(sessions, acme, [sft("one-more", "another question")])
    assert manifest(RECIPE) != before


def test_dataset_cli_builds_and_lists(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    store(on_test_database, acme, [sft(f"g{n}", f"question {n}") for n in range(10)])

    code, out, err = run_cli(capsys, "dataset", "build", "--domain", "billing", "--json")
    assert code == 0, err
    built = json.loads(out)
    assert (built["version"], built["is_new"]) == (1, True)
    assert built["recipe"]["ngram"] == 13

    code, out, _ = run_cli(capsys, "dataset", "list", "--domain", "billing", "--json")
    assert [item["id"] for item in json.loads(out)] == [built["id"]]
    code, _, err = run_cli(
        capsys, "dataset", "build", "--domain", "billing", "--eval-fraction", "1"
    )
    assert code == 2
    assert "eval fraction" in err


def test_a_version_exports_for_trl_with_its_manifest(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    domain_id = domain_of(on_test_database, acme)
    (group,) = groups_in("train", domain_id, 1)
    provenance = Provenance("feedback", "e-1", group)
    messages = [{"role": "user", "content": "Can I get a refund?"}]
    task = TaskCandidate(
        provenance,
        'def f():\n    """One."""\n',
        "f",
        'def f():\n    """One."""\n    return 1\n',
        "def test_f():\n    assert f() == 1\n",
    )
    store(
        on_test_database,
        acme,
        [
            sft(group, "How do I reset?"),
            PairCandidate(provenance, messages, "Yes, within 30 days.", "No.", "correction", 0.7),
            task,
        ],
    )
    with unit_of_work(on_test_database) as session:
        session.execute(update(VerifiableTask).values(verifier_status="usable"))
    assert run_cli(capsys, "dataset", "build", "--domain", "billing")[0] == 0

    out = tmp_path / "v1"
    code, stdout, err = run_cli(
        capsys, "dataset", "export", "1", "--domain", "billing", "--out", str(out), "--json"
    )

    assert code == 0, err
    assert sorted(json.loads(stdout)["files"]) == [
        "train/dpo.jsonl",
        "train/grpo.jsonl",
        "train/sft.jsonl",
    ]
    dpo = [json.loads(line) for line in (out / "train" / "dpo.jsonl").read_text().splitlines()]
    assert dpo == [
        {
            "prompt": messages,
            "chosen": [{"role": "assistant", "content": "Yes, within 30 days."}],
            "rejected": [{"role": "assistant", "content": "No."}],
            "weight": 0.7,
        }
    ]
    grpo = json.loads((out / "train" / "grpo.jsonl").read_text())
    assert "assert f() == 1" in grpo["tests"]
    assert "assert" not in json.dumps(grpo["prompt"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["domain"], manifest["version"]) == ("billing", 1)

    code, _, err = run_cli(
        capsys, "dataset", "export", "7", "--domain", "billing", "--out", str(tmp_path / "v7")
    )
    assert code == 2
    assert "dataset version 7 not found" in err


def test_a_shared_system_prompt_is_not_contamination(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    domain_id = domain_of(sessions, acme)
    system = {"role": "system", "content": EVAL_TEXT}  # 28 words every item carries
    groups = [*groups_in("eval", domain_id, 2), *groups_in("train", domain_id, 4)]
    store(
        sessions,
        acme,
        [
            SftCandidate(
                Provenance("api", group, group),
                [system, {"role": "user", "content": f"{group} asks something"}],
                "ok",
            )
            for group in groups
        ],
    )

    built = build(sessions, acme)

    assert built.stats["contaminated"] == {}
    assert built.stats["train"] == {"sft": 4}


def test_members_keep_each_weight_and_position_exactly(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    """A version's member rows (COPY text on PostgreSQL) hold the item's weight to the last
    digit, and positions 0.. in the split's order."""
    domain_id = domain_of(sessions, acme)
    weights = [0.1 + 0.2, 1e-300, 2.0 / 3.0, 123456789.125]
    groups = list(groups_in("train", domain_id, len(weights)))
    store(sessions, acme, [sft(group, f"question {group}") for group in groups])
    with unit_of_work(sessions) as session:
        for group, weight in zip(groups, weights, strict=True):
            session.execute(
                update(SftExample).where(SftExample.group_key == group).values(weight=weight)
            )

    version = build(sessions, acme).version

    with sessions() as session:
        held = version_members(session, version)
        assert stored_manifest(session, version) == version.manifest_sha256
    assert {item.group_key: item.weight for item in held} == dict(zip(groups, weights, strict=True))


def member_rows(sessions: sessionmaker[Session]) -> int:
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(DatasetMember)) or 0


def held(sessions: sessionmaker[Session], version: DatasetVersion) -> dict[str, dict[str, float]]:
    """Split -> group key -> weight of what the version holds, checked against its manifest."""
    with sessions() as session:
        found: dict[str, dict[str, float]] = {"train": {}, "eval": {}}
        for item in version_members(session, version):
            found[item.split][item.group_key] = item.weight
        assert stored_manifest(session, version) == version.manifest_sha256
    return found


def test_a_version_stores_what_changed_and_reads_back_what_it_holds(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    """A week's version writes rows for its new items, not its whole eval set and a fresh
    replay draw again; reading it (and every earlier version) gives what its build hashed."""
    domain_id = domain_of(sessions, acme)
    recipe = DatasetRecipe(eval_fraction=0.3, replay_fraction=0.5)
    old = list(groups_in("train", domain_id, 60)) + list(groups_in("eval", domain_id, 20))
    store(sessions, acme, [sft(group, f"{group} question") for group in old])
    first = build(sessions, acme, recipe)
    v1 = held(sessions, first.version)
    assert (len(v1["train"]), len(v1["eval"])) == (60, 20)

    new = list(groups_in("train", domain_id, 3, prefix="new"))
    store(sessions, acme, [sft(group, f"{group} question") for group in new])
    before = member_rows(sessions)
    second = build(sessions, acme, recipe)

    assert member_rows(sessions) - before == second.rows["added"] == 3
    v2 = held(sessions, second.version)
    assert v2["eval"] == v1["eval"]
    replayed = set(v2["train"]) - set(new)
    assert set(new) <= set(v2["train"])
    assert replayed < set(v1["train"])
    assert len(replayed) == second.stats["replayed"] > 0  # drawn when read, not stored
    assert held(sessions, first.version) == v1  # an earlier version reads as it was built


def test_items_that_change_leave_the_versions_after_and_stay_in_those_before(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    domain_id = domain_of(sessions, acme)
    recipe = DatasetRecipe(eval_fraction=0.3, replay_fraction=1.0)  # every old item replayed
    train = list(groups_in("train", domain_id, 6))
    evaluated = list(groups_in("eval", domain_id, 3))
    new = list(groups_in("train", domain_id, 2, prefix="new"))
    store(sessions, acme, [sft(group, f"{group} question") for group in train + evaluated])
    first = build(sessions, acme, recipe).version
    retracted, reweighted, dropped_eval = train[0], train[1], evaluated[0]
    with unit_of_work(sessions) as session:
        for group, weight in ((retracted, 0.0), (reweighted, 0.25), (dropped_eval, 0.0)):
            session.execute(
                update(SftExample).where(SftExample.group_key == group).values(weight=weight)
            )
    store(sessions, acme, [sft(new[0], f"{new[0]} question")])
    second = build(sessions, acme, recipe)

    v2 = held(sessions, second.version)
    assert set(v2["train"]) == set(train) - {retracted} | {new[0]}
    assert v2["train"][reweighted] == 0.25
    assert set(v2["eval"]) == set(evaluated) - {dropped_eval}
    # closed: the retracted train item, both items of changed weight (one reopened)
    assert (second.rows["closed"], second.rows["added"]) == (3, 2)
    v1 = held(sessions, first)
    assert set(v1["train"]) == set(train)
    assert v1["train"][reweighted] == 1.0
    assert set(v1["eval"]) == set(evaluated)

    with unit_of_work(sessions) as session:  # back to its weight: it reopens as it was
        session.execute(
            update(SftExample).where(SftExample.group_key == reweighted).values(weight=1.0)
        )
    store(sessions, acme, [sft(new[1], f"{new[1]} question")])
    third = build(sessions, acme, recipe)
    assert held(sessions, third.version)["train"][reweighted] == 1.0
    assert held(sessions, second.version)["train"][reweighted] == 0.25


@pytest.mark.postgres_only
def test_the_replay_draw_in_sql_is_the_one_python_makes(sessions: sessionmaker[Session]) -> None:
    """Reading a version on PostgreSQL draws its replay in the query: the same items as
    `is_drawn`, or an export would drop or add items its manifest hashed."""
    hashes = [f"{n:064x}" for n in range(0, 2**256, 2**256 // 500)] + ["f" * 64]
    texts = cast(array(hashes), ARRAY(Text))
    values = func.unnest(texts).table_valued("h").render_derived()
    with sessions() as session:
        for fraction in (0.0, 0.1, 0.25, 0.5, 0.9, 1.0):
            for salt in ("1", "7"):
                drawn = {sha: is_drawn(salt, sha, fraction) for sha in hashes}
                in_sql = session.execute(
                    select(values.c.h, sql_draw(salt, values.c.h, fraction))
                ).all()
                assert dict(in_sql) == drawn
                assert 0 < sum(drawn.values()) < len(drawn) or fraction in (0.0, 1.0)

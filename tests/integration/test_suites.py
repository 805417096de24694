"""Suites without training: `flywheel suites create|list|show` and their one-line errors, and
the suite's combined export (each member's share of the draws, the cross-member curriculum,
every row tagged with its domain)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from finetune import synthetic
from finetune.data import Export, open_export
from finetune.sampling import draw, is_curriculum
from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.db import unit_of_work
from flywheel.errors import InvalidState
from flywheel.models import VerifiableTask
from flywheel.signals.candidates import Provenance, SftCandidate, TaskCandidate
from flywheel.signals.store import store_candidates
from flywheel.suites.export import export_suite
from flywheel.suites.service import get_suite
from flywheel.suites.training import member_versions
from flywheel.tenancy import service as tenancy
from tests.conftest import Caller, run_cli

EVAL_FRACTION = 0.4


def add_domain(sessions: sessionmaker[Session], caller: Caller, name: str) -> None:
    with unit_of_work(sessions) as session:
        owner = tenancy.get_tenant(session=session, name=caller.tenant)
        tenancy.create_domain(session=session, tenant=owner, name=name)


def fill(
    sessions: sessionmaker[Session],
    caller: Caller,
    domain: str,
    problems: list[synthetic.Problem],
    *,
    has_tasks: bool = False,
) -> None:
    """SFT examples (and answer tasks) of these problems in the domain, and a version built."""
    candidates: list[SftCandidate | TaskCandidate] = [
        SftCandidate(Provenance("task_file", p.prompt, p.prompt), synthetic.user(p), p.answer)
        for p in problems
    ]
    if has_tasks:
        candidates += [
            TaskCandidate(
                Provenance("task_file", f"task {p.prompt}", p.prompt),
                p.prompt,
                None,
                None,
                None,
                task_kind="answer",
                answer=p.answer,
            )
            for p in problems
        ]
    with unit_of_work(sessions) as session:
        found = tenancy.get_domain(session, caller.tenant_id, domain)
        store_candidates(session=session, tenant_id=caller.tenant_id, domain_id=found.id,
                         candidates=candidates, ingestor_version="test")  # fmt: skip
        if has_tasks:  # a measured pass rate per task: 0.0, 0.1, ... as verifier QA records
            tasks = session.scalars(
                select(VerifiableTask).where(VerifiableTask.domain_id == found.id)
            ).all()
            for index, task in enumerate(sorted(tasks, key=lambda t: t.prompt)):
                task.difficulty = (index % 11) / 10
        build_dataset_version(session=session, tenant_id=caller.tenant_id, domain_id=found.id,
                              recipe=DatasetRecipe(eval_fraction=EVAL_FRACTION))  # fmt: skip


@pytest.fixture
def two_domains(on_test_database: sessionmaker[Session], acme: Caller) -> Caller:
    add_domain(on_test_database, acme, "shipping")
    return acme


def test_suites_create_list_and_show(
    two_domains: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "suites", "create", "support", "--domain", "billing=0.7",
                             "--domain", "shipping=0.3", "--json")  # fmt: skip

    assert code == 0, err
    created = json.loads(out)
    assert created["members"] == {"billing": 0.7, "shipping": 0.3}
    assert created["curriculum"] == "easy_first"

    code, out, _ = run_cli(capsys, "suites", "list")
    assert (code, out.strip()) == (0, "support: billing=0.7, shipping=0.3")
    code, out, _ = run_cli(capsys, "suites", "show", "support", "--json")
    assert code == 0
    assert json.loads(out)["runs"] == []
    assert json.loads(out)["members"] == created["members"]

    code, _, err = run_cli(capsys, "suites", "create", "support", "--domain", "billing=1",
                           "--domain", "shipping=1")  # fmt: skip
    assert (code, err) == (1, "error: suite 'support' already exists\n")


@pytest.mark.parametrize(
    ("members", "message"),
    [
        (["billing=0.5", "nope=0.5"], "domain 'nope' not found"),
        (["billing=0.5", "payroll=0.5"], "domain 'payroll' not found"),  # globex's
        (["billing=0", "shipping=1"], "the weight of domain 'billing' must be above 0, not 0.0"),
        (["billing=-1", "shipping=1"], "the weight of domain 'billing' must be above 0"),
        (["billing=nan", "shipping=1"], "the weight of domain 'billing' must be above 0"),
        (["billing=lots", "shipping=1"], "the weight of domain 'billing' must be a number"),
        (["billing", "shipping=1"], "--domain 'billing' must be NAME=WEIGHT"),
        (["billing=1"], "a suite needs at least 2 member domains, not 1"),
        (["billing=1", "billing=2"], "domain 'billing' is named twice"),
    ],
)
def test_suites_create_refuses_bad_members_in_one_line(
    two_domains: Caller,
    on_test_database: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    members: list[str],
    message: str,
) -> None:
    with unit_of_work(on_test_database) as session:
        other = tenancy.create_tenant(session=session, name="globex")
        tenancy.create_domain(session=session, tenant=other, name="payroll")
    flags = [part for member in members for part in ("--domain", member)]

    code, out, err = run_cli(capsys, "suites", "create", "support", "--tenant", "acme", *flags)

    assert code == 2
    assert out == ""
    assert err.startswith(f"error: {message}")
    assert err.count("\n") == 1
    code, out, _ = run_cli(capsys, "suites", "list", "--tenant", "acme", "--json")
    assert json.loads(out) == []  # nothing was created


def test_the_suite_export_draws_each_member_by_its_weight_and_tags_its_rows(
    two_domains: Caller, on_test_database: sessionmaker[Session], tmp_path: Path
) -> None:
    sessions = on_test_database
    problems = synthetic.split_problems().train
    fill(sessions, two_domains, "billing", problems[:40])
    fill(sessions, two_domains, "shipping", problems[40:50])  # a quarter of billing's size
    run_cli_create(sessions, two_domains, {"billing": 0.25, "shipping": 0.75}, "none")

    export = suite_export(sessions, two_domains, tmp_path)

    rows = [
        json.loads(line) for line in (tmp_path / "dataset/train/sft.jsonl").read_text().splitlines()
    ]
    held = Counter(row["domain"] for row in rows)
    section = export.manifest["suite"]
    for name in ("billing", "shipping"):
        assert held[name] == section["members"][name]["rows"]["train/sft.jsonl"] > 0
    mass: Counter[str] = Counter()
    for row in rows:
        mass[row["domain"]] += row["weight"]
    assert mass["shipping"] / (mass["billing"] + mass["shipping"]) == pytest.approx(0.75)
    # what the trainer's sampler then draws (finetune.sampling): shipping's share, not its size
    weights = torch.tensor([row["weight"] for row in rows], dtype=torch.double)
    drawn = Counter(rows[index]["domain"] for index in draw(weights, 4000, 0, 0, is_ordered=False))
    assert drawn["shipping"] / 4000 == pytest.approx(0.75, abs=0.03)
    assert not is_curriculum(export)  # curriculum none: the trainer shuffles


def test_an_easy_first_suite_orders_every_members_tasks_by_pass_rate(
    two_domains: Caller, on_test_database: sessionmaker[Session], tmp_path: Path
) -> None:
    sessions = on_test_database
    problems = synthetic.split_problems().train
    fill(sessions, two_domains, "billing", problems[:30], has_tasks=True)
    fill(sessions, two_domains, "shipping", problems[30:60], has_tasks=True)
    run_cli_create(sessions, two_domains, {"billing": 1, "shipping": 1}, "easy_first")

    export = suite_export(sessions, two_domains, tmp_path)

    assert is_curriculum(export)  # the trainer keeps the file's order
    rows = [
        json.loads(line)
        for line in (tmp_path / "dataset/train/grpo.jsonl").read_text().splitlines()
    ]
    ease = [row["difficulty"] for row in rows]
    assert ease == sorted(ease, reverse=True)  # easy (high pass rate) first, across members
    assert len(set(ease)) > 5
    # both members' tasks run from easy to hard: neither waits for the other to finish
    for name in ("billing", "shipping"):
        positions = [index for index, row in enumerate(rows) if row["domain"] == name]
        assert positions[0] < len(rows) / 4
        assert positions[-1] > len(rows) * 3 / 4


def run_cli_create(
    sessions: sessionmaker[Session], caller: Caller, members: dict[str, float], curriculum: str
) -> None:
    from flywheel.suites.service import create_suite

    with unit_of_work(sessions) as session:
        create_suite(session=session, tenant_id=caller.tenant_id, name="support",
                     members=members, curriculum=curriculum)  # fmt: skip


def suite_export(sessions: sessionmaker[Session], caller: Caller, root: Path) -> Export:
    with unit_of_work(sessions) as session:
        loaded = get_suite(session, caller.tenant_id, "support")
        export_suite(session, loaded, member_versions(session, loaded), root / "dataset")
    return open_export(root / "dataset")


def test_a_suite_refuses_a_member_whose_train_shares_a_prompt_with_anothers_eval_set(
    two_domains: Caller, on_test_database: sessionmaker[Session]
) -> None:
    sessions = on_test_database
    # the same 60 questions in both, each domain splitting them its own way: some question
    # lands in billing's train and shipping's eval but in 0.76^60 (1e-7) of domain ids
    problems = synthetic.split_problems().train[:60]
    fill(sessions, two_domains, "billing", problems)
    fill(sessions, two_domains, "shipping", problems)
    run_cli_create(sessions, two_domains, {"billing": 1, "shipping": 1}, "none")

    with unit_of_work(sessions) as session, pytest.raises(InvalidState) as raised:
        member_versions(session, get_suite(session, two_domains.tenant_id, "support"))

    assert "train split shares" in raised.value.message
    assert "another member's eval set" in raised.value.message

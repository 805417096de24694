"""Releases by canary: the challenger against the champion on the same period's traffic.

A challenger users like no less is promoted by `watch` (live evidence on the event, the gate
rules still applying); a worse one is retired and no canary serves it again; too few ratings
move nothing. A cycle in a canary domain leaves its candidate as the challenger. The decision
itself is calibrated on simulated thumbs: equal true rates retire about alpha of the time.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work, utcnow
from flywheel.feedback.service import (
    NewFeedback,
    NewInteraction,
    record_feedback,
    record_interaction,
)
from flywheel.models import Domain, ModelVersion, PromotionEvent, Run
from flywheel.registry import service
from flywheel.registry.canary import DomainWatch, decide, watch, watch_domains
from flywheel.registry.mlflow_registry import MlflowRegistry
from flywheel.registry.release import current_challenger
from flywheel.registry.watch import LiveRates
from flywheel.scheduling.cycle import CycleRequest, run_cycle
from flywheel.scheduling.jobs import WATCH_TASK, make_job_app
from flywheel.settings import Settings
from flywheel.tenancy.service import get_domain
from tests.conftest import Caller, run_cli
from tests.integration.test_registry import PASSED, register
from tests.integration.test_webhooks import SECRET, serve_receiver

CANARY = {"challenger_share": 0.1, "auto_promote": True, "auto_rollback": True}


def traffic(
    sessions: sessionmaker[Session], caller: Caller, counts: dict[str, tuple[int, int]]
) -> None:
    """Interactions served by each `acme.billing` version or the "base" (ups, downs),
    interleaved in time as a canary's users are (the first listed serves first), each rated
    once with a thumb: recorded through the feedback service, as the REST API records them."""
    thumbs = {version: ["up"] * ups + ["down"] * downs for version, (ups, downs) in counts.items()}
    with unit_of_work(sessions) as session:
        connection = session.connection()
        for n in range(max(len(given) for given in thumbs.values())):
            for version, given in thumbs.items():
                if n >= len(given):
                    continue
                served = record_interaction(
                    connection=connection,
                    tenant_id=caller.tenant_id,
                    new=NewInteraction(
                        domain="billing", messages=[{"role": "user", "content": f"q{n}"}],
                        response=f"a{n}", model_name=None if version == "base" else "acme.billing",
                        model_version=None if version == "base" else version,
                    ),
                    idempotency_key=None,
                )  # fmt: skip
                record_feedback(
                    connection=connection,
                    tenant_id=caller.tenant_id,
                    new=NewFeedback(
                        kind="rating", value={"thumbs": given[n]}, interaction_id=served.id
                    ),
                    idempotency_key=None,
                )


def configure(sessions: sessionmaker[Session], config: dict[str, Any]) -> None:
    with unit_of_work(sessions) as session:
        session.execute(update(Domain).values(config=config))


@pytest.fixture
def canary(
    sessions: sessionmaker[Session], acme: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> MlflowRegistry:
    """v1 the champion, v2 (gated against v1 on the current eval set) the challenger."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path))
    registry = MlflowRegistry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    register(sessions, registry, acme, tmp_path, "one", PASSED)
    with unit_of_work(sessions) as session:
        service.promote(
            session=session, registry=registry,
            domain=get_domain(session, acme.tenant_id, "billing"), version="1", actor="t",
        )  # fmt: skip
    register(sessions, registry, acme, tmp_path, "two", PASSED)
    configure(sessions, {"release": CANARY})
    return registry


def watched(
    sessions: sessionmaker[Session], registry: MlflowRegistry, caller: Caller
) -> DomainWatch:
    with unit_of_work(sessions) as session:
        return watch(
            session=session,
            registry=registry,
            domain=get_domain(session, caller.tenant_id, "billing"),
        )


def challenger_of(sessions: sessionmaker[Session], caller: Caller) -> str | None:
    with sessions() as session:
        found = current_challenger(session, get_domain(session, caller.tenant_id, "billing").id)
        return found.version if found else None


def events(sessions: sessionmaker[Session]) -> list[PromotionEvent]:
    with sessions() as session:
        return list(
            session.scalars(select(PromotionEvent).order_by(PromotionEvent.created_at)).all()
        )


def test_a_challenger_users_like_no_less_is_promoted_with_the_live_evidence(
    sessions: sessionmaker[Session], acme: Caller, canary: MlflowRegistry
) -> None:
    traffic(sessions, acme, {"1": (60, 0)})  # before the canary: not the same period
    traffic(sessions, acme, {"2": (34, 6), "1": (28, 12)})  # 70% against 85%

    result = watched(sessions, canary, acme).release

    assert (result.decision, result.action) == ("promote", "promoted")
    assert result.champion is not None
    assert result.challenger is not None
    assert (result.champion.ratings, result.challenger.ratings) == (40, 40)
    assert result.champion.thumbs_up_rate == pytest.approx(0.7)
    assert canary.alias_version("acme.billing", "champion") == "2"
    moved = events(sessions)[-1]
    assert (moved.action, moved.actor, moved.alias) == ("promote", "watch", "champion")
    assert "not worse" in moved.reason
    live = moved.evidence["live"]
    assert live["challenger"]["thumbs_up_rate"] == pytest.approx(0.85)
    assert live["champion"]["ratings"] == 40
    assert live["p_value"] == pytest.approx(result.p_value)
    assert live["p_value"] > 0.05
    assert moved.evidence["gate"]["is_promoted"]  # the gate evidence is kept next to it


def test_a_worse_challenger_is_retired_and_no_longer_the_challenger(
    sessions: sessionmaker[Session], acme: Caller, canary: MlflowRegistry
) -> None:
    traffic(sessions, acme, {"2": (20, 30), "1": (40, 10)})  # 80% against 40%
    assert challenger_of(sessions, acme) == "2"
    configure(sessions, {"release": CANARY | {"auto_rollback": False}})

    flagged = watched(sessions, canary, acme).release
    assert (flagged.decision, flagged.action) == ("retire", None)
    assert "auto_rollback is off" in flagged.reason
    assert challenger_of(sessions, acme) == "2"

    configure(sessions, {"release": CANARY})
    retired = watched(sessions, canary, acme).release

    assert (retired.decision, retired.action) == ("retire", "retired")
    assert retired.p_value is not None
    assert retired.p_value < 0.05
    assert challenger_of(sessions, acme) is None
    assert canary.alias_version("acme.billing", "challenger") is None
    assert canary.alias_version("acme.billing", "champion") == "1"
    event = events(sessions)[-1]
    assert (event.action, event.alias, event.actor, event.to_model_version_id) == (
        "retire", "challenger", "watch", None,
    )  # fmt: skip
    assert event.evidence["live"]["challenger"]["ratings"] == 50
    assert watched(sessions, canary, acme).release.reason == "no challenger"


def test_too_few_ratings_move_nothing_and_say_what_is_missing(
    sessions: sessionmaker[Session], acme: Caller, canary: MlflowRegistry
) -> None:
    before = len(events(sessions))
    traffic(sessions, acme, {"2": (2, 8), "1": (20, 5)})

    result = watched(sessions, canary, acme).release

    assert (result.decision, result.action) == ("keep", None)
    assert result.reason == (
        "keep collecting: 5 more for the champion and 20 more for the challenger (need 30 each)"
    )
    assert len(events(sessions)) == before
    assert challenger_of(sessions, acme) == "2"


def test_a_challenger_with_a_stale_verdict_is_not_promoted(
    sessions: sessionmaker[Session], acme: Caller, canary: MlflowRegistry
) -> None:
    with unit_of_work(sessions) as session:
        version = session.scalars(select(ModelVersion).where(ModelVersion.version == "2")).one()
        version.gate_result = {**version.gate_result, "eval_sha256": "an older eval set"}
    traffic(sessions, acme, {"2": (35, 5), "1": (30, 10)})

    result = watched(sessions, canary, acme).release

    assert (result.decision, result.action) == ("promote", None)
    assert "not promoted: v2 of billing has a stale verdict" in result.reason
    assert "evaluate it first" in result.reason
    assert canary.alias_version("acme.billing", "champion") == "1"
    assert events(sessions)[-1].actor == "t"


@pytest.mark.postgres_only
def test_the_workers_periodic_watch_promotes_and_reports_each_watched_domain(
    sessions: sessionmaker[Session], acme: Caller, canary: MlflowRegistry, settings: Settings
) -> None:
    traffic(sessions, acme, {"2": (33, 7), "1": (30, 10)})
    app = make_job_app(
        settings.model_copy(update={"mlflow_tracking_uri": canary.tracking_uri}), sessions
    )

    results = app.tasks[WATCH_TASK].func(timestamp=int(time.time()))

    assert [(r["domain"], r["release"]["action"]) for r in results] == [("billing", "promoted")]
    assert canary.alias_version("acme.billing", "champion") == "2"
    assert watch_domains(sessions, canary)[0]["release"]["reason"] == "no challenger"


def test_without_a_champion_the_challenger_is_judged_against_the_base(
    sessions: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path))
    registry = MlflowRegistry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    register(sessions, registry, acme, tmp_path, "one", PASSED)
    configure(sessions, {"release": CANARY})
    traffic(sessions, acme, {"1": (31, 9), "base": (25, 15)})

    result = watched(sessions, registry, acme).release

    assert result.champion is not None
    assert (result.champion.version, result.champion.ratings) == ("base", 40)
    assert (result.decision, result.action) == ("promote", "promoted")
    assert registry.alias_version("acme.billing", "champion") == "1"


def test_release_auto_rollback_also_rolls_a_worse_champion_back(
    sessions: sessionmaker[Session], acme: Caller, canary: MlflowRegistry
) -> None:
    with unit_of_work(sessions) as session:
        service.promote(
            session=session, registry=canary,
            domain=get_domain(session, acme.tenant_id, "billing"), version="2", actor="t",
        )  # fmt: skip
    traffic(sessions, acme, {"1": (40, 10), "2": (20, 30)})

    seen = watched(sessions, canary, acme)

    assert seen.champion.rolled_back_to == "1"
    assert seen.release.reason == "the champion was rolled back: the canary waits"
    assert canary.alias_version("acme.billing", "champion") == "1"


def test_the_watch_command_prints_both_verdicts(
    capsys: pytest.CaptureFixture[str],
    on_test_database: sessionmaker[Session],
    acme: Caller,
    canary: MlflowRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLYWHEEL_MLFLOW_TRACKING_URI", canary.tracking_uri)
    traffic(on_test_database, acme, {"2": (5, 5), "1": (5, 5)})

    code, out, _ = run_cli(capsys, "models", "watch", "--domain", "billing")
    assert code == 0
    assert "release: keep collecting: 20 more for the champion" in out

    code, out, _ = run_cli(capsys, "models", "watch", "--domain", "billing", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["reason"] == "no champion with a predecessor"
    assert data["release"]["decision"] == "keep"
    assert data["release"]["challenger"]["ratings"] == 10


def test_a_bad_release_config_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("release:\n  challenger_share: 1.5\n", encoding="utf-8")

    code, out, err = run_cli(
        capsys, "domains", "configure", "billing", "-t", "acme", "--file", str(bad)
    )

    assert code == 2
    assert out == ""
    assert err.strip().splitlines() == [
        "error: domain 'billing' release.challenger_share: Input should be less than or equal to 1"
    ]
    with on_test_database() as session:
        assert get_domain(session, acme.tenant_id, "billing").config == {}


def resumable_cycle(sessions: sessionmaker[Session], caller: Caller, version: str) -> None:
    """A cycle that trained `version` and gated it (passed against v1), then stopped before
    its promote step: the next `run_cycle` resumes at promote."""
    now = utcnow().isoformat()
    done = {"status": "succeeded", "started_at": now, "finished_at": now, "duration_s": 0.0}
    with unit_of_work(sessions) as session:
        domain = get_domain(session, caller.tenant_id, "billing")
        session.add(
            Run(
                tenant_id=caller.tenant_id, domain_id=domain.id, method="cycle",
                config={"trigger": "manual"}, config_sha256="0" * 64, status="failed",
                steps={
                    "compile": done | {"result": {}},
                    "build": done | {"result": {}},
                    "train_sft": done | {"result": {"model_version": version}},
                    "evaluate": done | {"result": {"is_promotable": True, "against": "1"}},
                },
            )
        )  # fmt: skip


@pytest.mark.parametrize(
    ("release", "promoted", "reason"),
    [
        (CANARY, False, "released to 10% of users by canary"),
        ({"shadow": True}, False, "answering in shadow"),
        ({}, True, None),  # no canary: the cycle promotes, as before
    ],
)
def test_a_cycle_in_a_canary_domain_leaves_its_candidate_the_challenger(
    sessions: sessionmaker[Session],
    acme: Caller,
    canary: MlflowRegistry,
    settings: Settings,
    release: dict[str, Any],
    promoted: bool,
    reason: str | None,
) -> None:
    configure(sessions, {"release": release})
    resumable_cycle(sessions, acme, "2")
    uri = settings.model_copy(update={"mlflow_tracking_uri": canary.tracking_uri})

    outcome = run_cycle(sessions, CycleRequest(acme.tenant_id, "billing"), uri)

    assert outcome.status == "succeeded", outcome.error
    result = outcome.steps["promote"]["result"]
    assert result["promoted"] is promoted
    if reason is not None:
        assert result["challenger"] is True
        assert reason in result["reasons"][0]
        assert challenger_of(sessions, acme) == "2"
        assert canary.alias_version("acme.billing", "champion") == "1"
    else:
        assert canary.alias_version("acme.billing", "champion") == "2"


def test_an_inline_cycles_promotion_sends_its_webhooks_at_once(
    sessions: sessionmaker[Session],
    acme: Caller,
    canary: MlflowRegistry,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`flywheel cycle` (no worker running) announces its promotion before it returns."""
    configure(sessions, {})  # no canary: the cycle promotes
    resumable_cycle(sessions, acme, "2")
    uri = settings.model_copy(update={"mlflow_tracking_uri": canary.tracking_uri})
    with serve_receiver() as receiver:
        monkeypatch.setenv("FLYWHEEL_WEBHOOK_URLS", receiver.url)
        monkeypatch.setenv("FLYWHEEL_WEBHOOK_SECRET", SECRET)

        outcome = run_cycle(sessions, CycleRequest(acme.tenant_id, "billing"), uri)

    result = outcome.steps["promote"]["result"]
    assert (result["promoted"], result["webhooks"]["delivered"]) == (True, 1), result
    assert [payload["data"]["to_version"] for payload in receiver.payloads()] == ["2"]
    assert all(item.is_signed for item in receiver.received)


def simulated(rate: float, ratings: int, rng: random.Random, version: str) -> LiveRates:
    ups = sum(rng.random() < rate for _ in range(ratings))
    return LiveRates(version, ratings, ups / ratings, ratings, None)


@pytest.mark.no_database
def test_equal_true_rates_retire_the_challenger_about_alpha_of_the_time() -> None:
    """20 seeds x 250 canaries of 200 simulated thumbs a side at 0.7 against 0.7: the
    retirement rate stays within alpha plus a margin (about 4 standard errors of 5,000
    draws); and the test has power: 0.7 against 0.55 retires nearly always."""
    retired = trials = 0
    per_seed = []
    for seed in range(20):
        rng = random.Random(seed)
        here = 0
        for _ in range(250):
            champion, challenger = simulated(0.7, 200, rng, "1"), simulated(0.7, 200, rng, "2")
            here += decide(champion, challenger, alpha=0.05, min_ratings=200).outcome == "retire"
        per_seed.append(here / 250)
        retired, trials = retired + here, trials + 250
    assert retired / trials <= 0.05 + 0.012, per_seed
    assert max(per_seed) <= 0.05 + 0.06, per_seed  # no seed far off either

    rng = random.Random(99)
    worse = [
        decide(
            simulated(0.7, 200, rng, "1"),
            simulated(0.55, 200, rng, "2"),
            alpha=0.05,
            min_ratings=200,
        ).outcome
        for _ in range(200)
    ]
    assert worse.count("retire") / len(worse) >= 0.9


@pytest.mark.no_database
def test_the_decision_waits_for_enough_ratings_on_both_sides() -> None:
    few = LiveRates("1", 29, 0.9, 29, None)
    many = LiveRates("2", 300, 0.1, 300, None)
    assert decide(few, many, alpha=0.05, min_ratings=30).outcome == "keep"
    assert decide(many, few, alpha=0.05, min_ratings=30).outcome == "keep"


def test_models_list_marks_a_retired_challenger(
    capsys: pytest.CaptureFixture[str],
    on_test_database: sessionmaker[Session],
    acme: Caller,
    canary: MlflowRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLYWHEEL_MLFLOW_TRACKING_URI", canary.tracking_uri)
    traffic(on_test_database, acme, {"2": (20, 30), "1": (40, 10)})
    assert watched(on_test_database, canary, acme).release.action == "retired"

    code, out, err = run_cli(capsys, "models", "list", "--domain", "billing", "--json")
    assert code == 0, err
    retired = {v["version"]: v["is_retired"] for v in json.loads(out)["versions"]}
    assert retired == {"2": True, "1": False}
    code, out, err = run_cli(capsys, "models", "list", "--domain", "billing")
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if line.startswith("v2 ")]
    assert line.endswith("RETIRED")

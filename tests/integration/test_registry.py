"""The model registry against real MLflow: versions with lineage, promotion through the gate,
rollback without retraining, the audit trail, and refusals that move nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest
from mlflow.artifacts import download_artifacts
from mlflow.tracking import MlflowClient
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.datasets.split import position_of
from flywheel.datasets.versions import latest_version
from flywheel.db import unit_of_work
from flywheel.errors import Conflict, NotFound, RegistryUnavailable
from flywheel.models import Domain, ModelVersion, PromotionEvent, Run, SftExample
from flywheel.registry import service
from flywheel.registry.mlflow_registry import MlflowRegistry
from flywheel.tenancy.service import get_domain
from tests.conftest import Caller, run_cli

PASSED = {"is_promoted": True, "reasons": []}
"""A passed gate; `register` makes it the verdict a cycle would store: against the version
registered before it (the base for the first), on the domain's current eval set."""
FAILED = {"is_promoted": False, "reasons": ["primary metric CI [-0.02, 0.03] includes 0"]}


@pytest.fixture
def tracking_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    return f"sqlite:///{home / 'mlflow.db'}"


def adapter_run(uri: str, tmp_path: Path, marker: str) -> str:
    """An MLflow run holding an `adapter` artifact directory; its id."""
    folder = tmp_path / f"adapter-{marker}"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"marker": marker}))
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.get_experiment_by_name("t") or mlflow.get_experiment(
        mlflow.create_experiment("t", artifact_location=(tmp_path / "artifacts").as_uri())
    )
    with mlflow.start_run(experiment_id=experiment.experiment_id) as run:
        mlflow.log_artifacts(str(folder), artifact_path="adapter")
    return str(run.info.run_id)


def register(
    sessions: sessionmaker[Session],
    registry: MlflowRegistry,
    caller: Caller,
    tmp_path: Path,
    marker: str,
    gate: dict[str, object],
) -> ModelVersion:
    run_id = adapter_run(registry.tracking_uri, tmp_path, marker)
    with unit_of_work(sessions) as session:
        domain_id = session.scalars(
            select(Domain.id).where(Domain.tenant_id == caller.tenant_id)
        ).one()
        run = Run(
            tenant_id=caller.tenant_id,
            domain_id=domain_id,
            method="sft",
            config_sha256="0" * 64,
            mlflow_run_id=run_id,
            status="succeeded",
        )
        session.add(run)
        session.flush()
        previous = session.scalars(
            select(ModelVersion)
            .where(ModelVersion.domain_id == domain_id)
            .order_by(ModelVersion.created_at.desc())
        ).first()
        version = service.register_version(
            session=session,
            registry=registry,
            run=run,
            adapter_uri=f"runs:/{run_id}/adapter",
            base_model="/models/tiny",
        )
        version.gate_result = gate
        if gate.get("is_promoted"):
            version.gate_result = gate | verdict_on(session, caller, domain_id, previous)
        return version


def verdict_on(
    session: Session, caller: Caller, domain_id: uuid.UUID, rival: ModelVersion | None
) -> dict[str, object]:
    """What `flywheel eval` records a verdict holds for: the rival and the current eval set
    (an empty dataset version is built when the domain has none)."""
    dataset = latest_version(session=session, domain_id=domain_id, is_untainted=True)
    if dataset is None:
        dataset = build_dataset_version(
            session=session, tenant_id=caller.tenant_id, domain_id=domain_id,
            recipe=DatasetRecipe(),
        ).version  # fmt: skip
    return {
        "against": rival.version if rival else "base",
        "against_model_version_id": str(rival.id) if rival else None,
        "eval_sha256": dataset.eval_sha256,
    }


def champion_marker(uri: str, name: str) -> str:
    files = download_artifacts(f"models:/{name}@champion", tracking_uri=uri)
    return str(json.loads((Path(files) / "adapter_config.json").read_text())["marker"])


def test_promote_then_rollback_moves_the_alias_and_audits_each_move(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sessions = on_test_database
    registry = MlflowRegistry(tracking_uri)
    first = register(sessions, registry, acme, tmp_path, "first", PASSED)
    second = register(sessions, registry, acme, tmp_path, "second", PASSED)
    assert (first.registered_model, first.version, second.version) == ("acme.billing", "1", "2")
    assert registry.alias_version("acme.billing", "challenger") == "2"

    assert run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")[0] == 0
    assert champion_marker(tracking_uri, "acme.billing") == "first"
    code, out, _ = run_cli(
        capsys, "models", "promote", "--domain", "billing", "--to", "2", "--reason", "better"
    )
    assert code == 0, out
    assert champion_marker(tracking_uri, "acme.billing") == "second"
    assert registry.alias_version("acme.billing", "challenger") is None  # promoted: no longer

    code, out, _ = run_cli(capsys, "models", "rollback", "--domain", "billing", "--json")

    assert code == 0
    assert json.loads(out)["to"] == "1"
    assert champion_marker(tracking_uri, "acme.billing") == "first"
    code, out, _ = run_cli(capsys, "models", "list", "--domain", "billing", "--json")
    listed = json.loads(out)
    assert listed["champion"] == "1"
    moves = [(e["action"], e["from"], e["to"]) for e in reversed(listed["history"])]
    assert moves == [("promote", None, "1"), ("promote", "1", "2"), ("rollback", "2", "1")]
    assert all(e["actor"].startswith("cli:") for e in listed["history"])
    assert listed["history"][1]["reason"] == "better"
    version = MlflowClient(tracking_uri=tracking_uri).get_model_version("acme.billing", "1")
    assert "flywheel.rollback" in version.tags
    assert version.tags["flywheel.base_model"] == "/models/tiny"


def test_a_version_that_failed_its_gate_needs_force_and_is_audited_as_forced(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    register(on_test_database, MlflowRegistry(tracking_uri), acme, tmp_path, "weak", FAILED)

    code, _, err = run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")
    assert code != 0
    assert "did not pass its gate" in err
    assert "includes 0" in err
    with on_test_database() as session:
        assert session.scalars(select(PromotionEvent)).all() == []

    code, _, _ = run_cli(
        capsys, "models", "promote", "--domain", "billing", "--to", "1", "--force",
        "--reason", "hotfix",
    )  # fmt: skip
    assert code == 0
    with on_test_database() as session:
        event = session.scalars(select(PromotionEvent)).one()
    assert event.is_forced
    assert event.evidence["gate"] == FAILED


def test_a_stale_verdict_is_refused_without_force(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """v1 once beat the base; v2 beat v1 and is champion. Promoting v1 again would ship the
    worse model on a verdict against the base: refused, nothing moved, until --force."""
    registry = MlflowRegistry(tracking_uri)
    register(on_test_database, registry, acme, tmp_path, "first", PASSED)
    register(on_test_database, registry, acme, tmp_path, "second", PASSED)
    assert run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")[0] == 0
    assert run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "2")[0] == 0

    code, out, err = run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")

    assert code != 0
    assert out == ""
    assert "stale verdict (it was gated against base, not v2)" in err
    assert "flywheel eval --domain billing --model-version 1" in err
    assert len(err.strip().splitlines()) == 1
    assert champion_marker(tracking_uri, "acme.billing") == "second"
    forced = run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1", "--force")
    assert forced[0] == 0
    with on_test_database() as session:
        latest = service.latest_champion_event(
            session, get_domain(session, acme.tenant_id, "billing").id
        )
        assert latest is not None
        assert latest.is_forced


def test_a_verdict_on_an_older_eval_set_is_refused(
    on_test_database: sessionmaker[Session], acme: Caller, tracking_uri: str, tmp_path: Path
) -> None:
    registry = MlflowRegistry(tracking_uri)
    register(on_test_database, registry, acme, tmp_path, "first", PASSED)
    with unit_of_work(on_test_database) as session:
        domain = get_domain(session, acme.tenant_id, "billing")
        # the split hashes (domain id, group key): a key that lands in eval for this domain
        group = next(f"g{n}" for n in range(100) if position_of(domain.id, f"g{n}") < 0.5)
        session.add(
            SftExample(
                tenant_id=acme.tenant_id, domain_id=domain.id, source_kind="api",
                group_key=group, content_sha256="1" * 64, ingestor_version="t",
                messages=[{"role": "user", "content": "new question"}], completion="answer",
            )
        )  # fmt: skip
        session.flush()
        built = build_dataset_version(
            session=session, tenant_id=acme.tenant_id, domain_id=domain.id,
            recipe=DatasetRecipe(eval_fraction=0.5),
        )  # fmt: skip
        assert built.stats["eval"] == {"sft": 1}  # the eval set changed since the verdict

    with (
        unit_of_work(on_test_database) as session,
        pytest.raises(Conflict, match="on another eval set than dataset v2's"),
    ):
        service.promote(
            session=session, registry=registry,
            domain=get_domain(session, acme.tenant_id, "billing"), version="1", actor="t",
        )  # fmt: skip
    with on_test_database() as session:
        assert session.scalars(select(PromotionEvent)).all() == []


def test_rollback_goes_only_to_a_former_champion(
    on_test_database: sessionmaker[Session], acme: Caller, tracking_uri: str, tmp_path: Path
) -> None:
    """`rollback --to` is instant because the version was champion before; to any other it
    would be a promotion without a gate."""
    registry = MlflowRegistry(tracking_uri)
    for marker in ("first", "second", "never"):
        register(on_test_database, registry, acme, tmp_path, marker, FAILED)
    for version in ("1", "2"):
        with unit_of_work(on_test_database) as session:
            service.promote(
                session=session, registry=registry, force=True,
                domain=get_domain(session, acme.tenant_id, "billing"), version=version, actor="t",
            )  # fmt: skip

    with (
        unit_of_work(on_test_database) as session,
        pytest.raises(Conflict, match="v3 was never champion of billing: promote it instead"),
    ):
        service.rollback(
            session=session, registry=registry, to="3",
            domain=get_domain(session, acme.tenant_id, "billing"), actor="t",
        )  # fmt: skip
    with unit_of_work(on_test_database) as session:
        event = service.rollback(
            session=session, registry=registry, to="1",
            domain=get_domain(session, acme.tenant_id, "billing"), actor="t",
        )  # fmt: skip
        assert (event.action, event.is_forced) == ("rollback", False)
    assert champion_marker(tracking_uri, "acme.billing") == "first"


def test_refusals_move_nothing(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    globex: Caller,
    tracking_uri: str,
    tmp_path: Path,
) -> None:
    registry = MlflowRegistry(tracking_uri)
    register(on_test_database, registry, acme, tmp_path, "only", PASSED)
    with unit_of_work(on_test_database) as session, pytest.raises(Conflict, match="no champion"):
        service.rollback(
            session=session, registry=registry,
            domain=get_domain(session, acme.tenant_id, "billing"),
            actor="t",
        )  # fmt: skip
    with unit_of_work(on_test_database) as session, pytest.raises(NotFound):
        service.promote(
            session=session, registry=registry,
            domain=get_domain(session, acme.tenant_id, "billing"),
            version="7", actor="t",
        )  # fmt: skip
    with unit_of_work(on_test_database) as session, pytest.raises(NotFound):  # globex's billing
        service.promote(
            session=session, registry=registry,
            domain=get_domain(session, globex.tenant_id, "billing"),
            version="1", actor="t",
        )  # fmt: skip
    with unit_of_work(on_test_database) as session:
        service.promote(
            session=session, registry=registry,
            domain=get_domain(session, acme.tenant_id, "billing"),
            version="1", actor="t",
        )  # fmt: skip
    with (
        unit_of_work(on_test_database) as session,
        pytest.raises(Conflict, match="no previous champion"),
    ):
        service.rollback(
            session=session, registry=registry,
            domain=get_domain(session, acme.tenant_id, "billing"),
            actor="t",
        )  # fmt: skip
    with on_test_database() as session:
        assert len(session.scalars(select(PromotionEvent)).all()) == 1


def test_an_unreachable_mlflow_is_a_clear_error_and_no_move(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    register(on_test_database, MlflowRegistry(tracking_uri), acme, tmp_path, "a", PASSED)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    down = MlflowRegistry(f"http://127.0.0.1:{_free_port()}")

    with (
        pytest.raises(RegistryUnavailable, match=r"could not move acme\.billing@champion"),
        unit_of_work(on_test_database) as session,
    ):
        service.promote(
            session=session, registry=down,
            domain=get_domain(session, acme.tenant_id, "billing"),
            version="1", actor="t",
        )  # fmt: skip

    with on_test_database() as session:
        assert session.scalars(select(PromotionEvent)).all() == []


@pytest.mark.postgres_only
@pytest.mark.commits("the second promotion waits on the first's lock from its own transaction")
def test_two_concurrent_promotions_one_wins_the_other_conflicts(
    on_test_database: sessionmaker[Session], acme: Caller, tracking_uri: str, tmp_path: Path
) -> None:
    registry = MlflowRegistry(tracking_uri)
    register(on_test_database, registry, acme, tmp_path, "a", PASSED)
    register(on_test_database, registry, acme, tmp_path, "b", PASSED)
    with unit_of_work(on_test_database) as first:
        service.promote(
            session=first, registry=registry,
            domain=get_domain(first, acme.tenant_id, "billing"),
            version="1", actor="first",
        )  # fmt: skip
        with unit_of_work(on_test_database) as second:  # while the first holds the domain
            second.execute(text("SET LOCAL lock_timeout = '2s'"))
            with pytest.raises(Conflict, match="in progress"):
                service.promote(
                    session=second, registry=registry,
                    domain=get_domain(second, acme.tenant_id, "billing"),
                    version="2", actor="second",
                )  # fmt: skip
    with on_test_database() as session:
        assert [e.actor for e in session.scalars(select(PromotionEvent))] == ["first"]


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    """A real `mlflow server` on loopback. Ready when MLflow's own API answers, not when the
    port accepts: between `_free_port` and the server's bind, another test's server (the other
    xdist worker's gateway) can take the port, and the test then talked to it. When the port
    was taken, mlflow exits; it is started again on another."""
    store = tmp_path / "server"
    store.mkdir()
    for _attempt in range(3):
        port = _free_port()
        command = [
            sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
            "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
            "--default-artifact-root", (store / "artifacts").as_uri(), "--workers", "1",
        ]  # fmt: skip
        with subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy()
        ) as server:
            url = f"http://127.0.0.1:{port}"
            if not _answers_as_mlflow(server, url):
                server.kill()
                server.wait(timeout=30)
                continue
            try:
                yield url
            finally:
                server.terminate()
                server.wait(timeout=30)
            return
    raise RuntimeError("mlflow server did not answer on any of 3 ports")


def _answers_as_mlflow(server: subprocess.Popen[bytes], url: str) -> bool:
    """Whether this server (still running) answers MLflow's API within 90 s."""
    probe = f"{url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return False  # e.g. the port was taken before it bound
        try:
            with urllib.request.urlopen(probe, timeout=5) as response:
                if "experiment" in json.loads(response.read()):
                    return True
        except (OSError, ValueError):
            pass  # not listening yet, or another server's answer
        time.sleep(0.5)
    return False


def test_promote_and_rollback_against_a_real_mlflow_server(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    mlflow_server: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("FLYWHEEL_MLFLOW_TRACKING_URI", mlflow_server)
    registry = MlflowRegistry(mlflow_server)
    register(on_test_database, registry, acme, tmp_path, "one", PASSED)
    register(on_test_database, registry, acme, tmp_path, "two", PASSED)

    assert run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")[0] == 0
    assert run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "2")[0] == 0
    assert champion_marker(mlflow_server, "acme.billing") == "two"
    assert run_cli(capsys, "models", "rollback", "--domain", "billing")[0] == 0

    assert champion_marker(mlflow_server, "acme.billing") == "one"
    assert registry.alias_version("acme.billing", "champion") == "1"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])

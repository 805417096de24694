"""`flywheel report`: a domain's history as one self-contained HTML file, from the database and
from real MLflow metric histories in a temporary store."""

from __future__ import annotations

import json
import re
import socket
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer
from mlflow.tracking import MlflowClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from flywheel.cli.report import report
from flywheel.db import unit_of_work
from flywheel.errors import NotFound
from flywheel.evaluation.gate import Evaluation, GatePolicy, decide
from flywheel.models import DatasetVersion, Domain, ModelVersion, PromotionEvent, Run
from flywheel.reporting import gather_report, render_html, write_report
from flywheel.reporting.metrics import MlflowMetricReader, RunMetrics
from flywheel.settings import Settings
from tests.conftest import Caller

SVG = "{http://www.w3.org/2000/svg}"
T0 = datetime(2025, 3, 3, 9, 0, tzinfo=UTC)
MISSING_RUN = "f" * 32
SFT_LOSS = [2.0, 1.6, 1.3, 1.1, 1.0]
GRPO_LOSS = [0.30, 0.28, 0.25]
GRPO_REWARD = [0.1, 0.3, 0.6]


@dataclass(frozen=True)
class History:
    tracking_uri: str
    sft_run: str
    grpo_run: str


@pytest.fixture
def mlflow_store(tmp_path: Path) -> History:
    """Two real MLflow runs with the metrics our trainer logs (finetune/tracking.py)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment(
        "report", artifact_location=(tmp_path / "artifacts").as_uri()
    )
    sft = client.create_run(experiment).info.run_id
    for step, loss in enumerate(SFT_LOSS, start=1):
        client.log_metric(sft, "loss", loss, step=step * 10)
        client.log_metric(sft, "tokens_per_s", 1000.0 + step, step=step * 10)
    grpo = client.create_run(experiment).info.run_id
    for step, (loss, reward) in enumerate(zip(GRPO_LOSS, GRPO_REWARD, strict=True), start=1):
        client.log_metric(grpo, "loss", loss, step=step)
        client.log_metric(grpo, "reward", reward, step=step)
    client.log_metric(grpo, "canary_pass_rate", 0.0, step=3)
    return History(uri, sft, grpo)


def summary(pass1: float, exact: float, loss: float) -> dict[str, float]:
    return {"pass@1": pass1, "exact_match": exact, "sft_loss": loss}


def evaluation(ours: dict[str, float], against: str, theirs: dict[str, float]) -> dict[str, object]:
    """`ModelVersion.eval_results` as flywheel.evaluation.service stores it."""
    return {
        "dataset_version_id": str(uuid.uuid4()),
        "dataset_version": 1,
        "eval_sha256": "e" * 64,
        "summary": ours,
        "losses": {"sft_loss": {"item-1": ours["sft_loss"]}},
        "scores": {"pass@1": {"item-1": ours["pass@1"]}, "exact_match": {"item-1": 1.0}},
        "slices": {"item-1": "ticket"},
        "against": {"version": against, "summary": theirs, "scores": {}},
    }


def gate(is_promoted: bool, against: str, reasons: list[str]) -> dict[str, object]:
    return {
        "is_promoted": is_promoted,
        "reasons": reasons,
        "against": against,
        "evidence": {"primary": {"metric": "pass@1", "passed": is_promoted}, "item_count": 40},
    }


CYCLE_STEPS = {
    "compile": {
        "status": "succeeded",
        "started_at": "2025-03-03T10:00:00+00:00",
        "finished_at": "2025-03-03T10:00:12+00:00",
        "duration_s": 12.0,
        "result": {"sft_examples": 3},
    },
    "promote": {"status": "skipped", "result": {"why": "gate failed"}},
    "build": {
        "status": "succeeded",
        "started_at": "2025-03-03T10:00:12+00:00",
        "finished_at": "2025-03-03T10:00:20+00:00",
    },  # no duration_s: computed from the times
    "train_sft": {"status": "succeeded", "duration_s": 3725.0},
    "evaluate": {"status": "failed", "duration_s": 30.5},
    "notify": "failed",  # not a mapping: read as its status
}


def seed(sessions: sessionmaker[Session], caller: Caller, history: History) -> None:
    """Two dataset versions, four runs (one a cycle, one with an unknown MLflow run), three
    model versions and three champion moves."""
    with unit_of_work(sessions) as session:
        domain = session.scalars(select(Domain).where(Domain.tenant_id == caller.tenant_id)).one()
        ids = {"tenant_id": caller.tenant_id, "domain_id": domain.id}
        v1 = DatasetVersion(
            **ids,
            version=1,
            manifest_sha256="1" * 64,
            stats={"train": {"sft": 8, "pair": 2}, "eval": {"sft": 4}, "groups": {"train": 6}},
            created_at=T0,
        )
        v2 = DatasetVersion(
            **ids,
            version=2,
            manifest_sha256="2" * 64,
            stats={"train": {"task": 5}},
            tainted_at=T0 + timedelta(days=2),
            created_at=T0 + timedelta(days=1),
        )
        session.add_all([v1, v2])
        session.flush()

        def run(method: str, mlflow_run_id: str | None, hours: int, **more: object) -> Run:
            row = Run(
                **ids,
                dataset_version_id=v1.id,
                method=method,
                config_sha256="0" * 64,
                mlflow_run_id=mlflow_run_id,
                created_at=T0 + timedelta(hours=hours),
                started_at=T0 + timedelta(hours=hours),
                **more,
            )
            session.add(row)
            return row

        sft = run("sft", history.sft_run, 1, status="succeeded",
                  finished_at=T0 + timedelta(hours=1, minutes=5))  # fmt: skip
        grpo = run("grpo", history.grpo_run, 2, status="succeeded")
        run("dpo", MISSING_RUN, 3, status="failed", error="CUDA out of memory")
        run("cycle", None, 4, status="failed", steps=CYCLE_STEPS, error="evaluate failed")
        session.flush()

        def version(number: str, made_by: Run | None, **more: object) -> ModelVersion:
            row = ModelVersion(
                **ids,
                training_run_id=made_by.id if made_by else None,
                registered_model="acme.billing",
                version=number,
                adapter_uri=f"runs:/{number}/adapter",
                base_model="/models/tiny",
                created_at=T0 + timedelta(days=int(number)),
                **more,
            )
            session.add(row)
            return row

        base = summary(0.20, 0.10, 2.5)
        first = version("1", sft, eval_results=evaluation(summary(0.40, 0.15, 1.9), "base", base),
                        gate_result=gate(True, "base", []))  # fmt: skip
        second = version(
            "2",
            grpo,
            eval_results=evaluation(summary(0.45, 0.05, 1.8), "1", summary(0.40, 0.15, 1.9)),
            gate_result=gate(False, "1", ["exact_match regressed by 0.1000 (0.1500 -> 0.0500)"]),
        )
        version("3", None)  # registered, never evaluated
        session.flush()
        moves = [
            ("promote", None, first, False, "beats the base"),
            ("promote", first, second, True, "<b>ship it</b>"),
            ("rollback", second, first, False, "exact match regressed in production"),
        ]
        for hours, (action, old, new, forced, why) in enumerate(moves):
            session.add(
                PromotionEvent(
                    **ids,
                    alias="champion",
                    action=action,
                    from_model_version_id=old.id if old else None,
                    to_model_version_id=new.id,
                    actor="cli:alice",
                    reason=why,
                    is_forced=forced,
                    created_at=T0 + timedelta(days=5, hours=hours),
                )
            )


def svgs(document: str) -> dict[str, ET.Element]:
    """Each inline chart, parsed as XML (so it is well-formed), by its title."""
    charts = [ET.fromstring(svg) for svg in re.findall(r"<svg\b.*?</svg>", document, re.S)]
    return {chart.get("aria-label", ""): chart for chart in charts}


def series(chart: ET.Element) -> dict[str, int]:
    """Line label -> number of points drawn."""
    found = {}
    for group in chart.iter(f"{SVG}g"):
        if group.get("class") == "series":
            line = group.find(f"{SVG}polyline")
            assert line is not None
            found[group.get("data-label", "")] = len(line.get("points", "").split())
    return found


def section(document: str, table_id: str) -> str:
    match = re.search(rf'<table id="{table_id}"[^>]*>.*?</table>', document, re.S)
    assert match is not None, f"no {table_id} table"
    return match.group(0)


def rows(table: str) -> list[str]:
    """Each body row's text, tags removed, cells joined by " | "."""
    body = table.split("<tbody>", 1)[1]
    found = []
    for row in re.findall(r"<tr>(.*?)</tr>", body, re.S):
        cells = re.findall(r"<td>(.*?)</td>", row, re.S)
        found.append(" | ".join(re.sub(r"<title>.*?</title>|<[^>]+>", "", c) for c in cells))
    return found


def test_report_shows_the_domains_history(
    sessions: sessionmaker[Session], acme: Caller, mlflow_store: History
) -> None:
    seed(sessions, acme, mlflow_store)
    with sessions() as session:
        found = gather_report(
            session,
            tenant_id=acme.tenant_id,
            domain="billing",
            tracking_uri=mlflow_store.tracking_uri,
        )
    document = render_html(found)

    assert found.champion == "1"
    assert found.champion_since == T0 + timedelta(days=5, hours=2)  # the rollback put it back
    summary_rows = rows(section(document, "summary"))
    assert "Champion | v1 (promoted 2025-03-08 11:00:00 UTC)" in summary_rows
    assert "Dataset versions | 2" in summary_rows
    assert "Training runs | 4" in summary_rows
    assert "Model versions | 3" in summary_rows

    assert rows(section(document, "datasets")) == [
        "v1 | 2025-03-03 09:00:00 UTC | pair 2, sft 8 | 10 | sft 4 | 4 | no",
        "v2 | 2025-03-04 09:00:00 UTC | task 5 | 5 | — | 0 | tainted",
    ]

    runs = rows(section(document, "runs"))
    assert [run.split(" | ")[1:5] for run in runs] == [
        ["sft", "succeeded", "v1", "v1"],
        ["grpo", "succeeded", "v1", "v2"],
        ["dpo", "failed", "v1", "—"],
        ["cycle", "failed", "v1", "—"],
    ]
    assert " | 5m 00s | loss 1.0000, tokens_per_s 1005 | " in runs[0]
    assert "reward 0.6000, canary_pass_rate 0.0000" in runs[1]
    assert runs[2].endswith(" | metrics unavailable | CUDA out of memory")

    steps = rows(section(document, "steps-[0-9a-f]{8}"))
    assert [step.split(" | ")[:2] for step in steps] == [
        ["compile", "succeeded"],
        ["build", "succeeded"],
        ["train_sft", "succeeded"],
        ["evaluate", "failed"],
        ["promote", "skipped"],
        ["notify", "failed"],
    ]
    assert steps[0] == (
        "compile | succeeded | 2025-03-03 10:00:00 UTC | 2025-03-03 10:00:12 UTC | 12.0 s"
    )
    assert [step.split(" | ")[4] for step in steps] == [
        "12.0 s", "8.0 s", "1h 02m", "30.5 s", "—", "—"
    ]  # fmt: skip

    charts = svgs(document)
    assert series(charts["Training loss"]) == {"sft v1": 5, "grpo v2": 3}
    assert series(charts["GRPO reward"]) == {"grpo v2": 3}  # only GRPO runs have rewards
    unavailable = re.search(r'<ul class="unavailable">(.*?)</ul>', document, re.S)
    assert unavailable is not None
    assert "dpo run " in unavailable.group(1)
    assert f"MLflow run {MISSING_RUN}): metrics unavailable" in unavailable.group(1)

    bars = [
        (rect.get("data-label"), rect.find(f"{SVG}title").text)  # type: ignore[union-attr]
        for rect in charts["Held-out metrics"].iter(f"{SVG}rect")
        if rect.get("class") == "bar"
    ]
    assert bars == [
        ("base", "base: 0.2"), ("v1", "v1: 0.4"), ("v2", "v2: 0.45"),  # primary metric first
        ("base", "base: 0.1"), ("v1", "v1: 0.15"), ("v2", "v2: 0.05"),
    ]  # fmt: skip
    loss_bars = charts["Held-out loss"].iter(f"{SVG}rect")
    assert [r.get("data-label") for r in loss_bars if r.get("class") == "bar"] == [
        "base", "v1", "v2"
    ]  # fmt: skip

    assert "Bars: the base model as scored in v1's evaluation (dataset v1);" in document
    evaluations = section(document, "evaluations")
    assert re.findall(r"<th>(.*?)</th>", evaluations) == [
        "Version", "Against", "Dataset", "pass@1", "exact_match", "sft_loss", "Gate", "Reasons"
    ]  # fmt: skip
    assert rows(evaluations) == [
        "v1champion | base | v1 | 0.4000 vs 0.2000 (+0.2000) | 0.1500 vs 0.1000 (+0.0500) "
        "| 1.9000 vs 2.5000 (-0.6000) | passed | ",
        "v2 | v1 | v1 | 0.4500 vs 0.4000 (+0.0500) | 0.0500 vs 0.1500 (-0.1000) "
        "| 1.8000 vs 1.9000 (-0.1000) | failed | exact_match regressed by 0.1000 "
        "(0.1500 -&gt; 0.0500)",
        "v3 | — | — | — | — | — | not gated | ",
    ]

    assert rows(section(document, "events")) == [
        "2025-03-08 09:00:00 UTC | promote | none → v1 | cli:alice | no | beats the base",
        "2025-03-08 10:00:00 UTC | promote | v1 → v2 | cli:alice | forced "
        "| &lt;b&gt;ship it&lt;/b&gt;",
        "2025-03-08 11:00:00 UTC | rollback | v2 → v1 | cli:alice | no "
        "| exact match regressed in production",
    ]
    assert "<b>ship it</b>" not in document
    assert "<script" not in document
    assert "http://" not in document.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_an_empty_domain_reports_nothing_yet(
    sessions: sessionmaker[Session], acme: Caller, tmp_path: Path
) -> None:
    with sessions() as session:
        found = gather_report(
            session,
            tenant_id=acme.tenant_id,
            domain="billing",
            tracking_uri=f"sqlite:///{tmp_path}/never.db",
        )
    document = render_html(found)
    assert found.champion is None
    assert "Champion | none yet" in rows(section(document, "summary"))
    for sentence in ("No dataset versions yet.", "No training runs yet.", "No loss logged",
                     "No model version evaluated yet.", "No promotions yet."):  # fmt: skip
        assert sentence in document
    assert not (tmp_path / "never.db").exists()  # no run to read: MLflow untouched


def test_one_failing_metric_read_spoils_only_that_run(
    sessions: sessionmaker[Session], acme: Caller, mlflow_store: History
) -> None:
    class FlakyReader:
        """An honest fake: the sft run's metrics, and a store that fails for any other."""

        def read(self, run_id: str) -> RunMetrics:
            if run_id != mlflow_store.sft_run:
                raise ConnectionError("mlflow.internal:5000 refused the connection")
            return RunMetrics({"loss": [(1.0, 2.0), (2.0, 1.0)]}, {"loss": 1.0})

    seed(sessions, acme, mlflow_store)
    with sessions() as session:
        found = gather_report(
            session, tenant_id=acme.tenant_id, domain="billing", tracking_uri="unused",
            metrics=FlakyReader(),
        )  # fmt: skip
    assert [run.metrics_error for run in found.runs] == [
        None,
        "mlflow.internal:5000 refused the connection",
        "mlflow.internal:5000 refused the connection",
        None,  # the cycle has no MLflow run
    ]
    document = render_html(found)
    assert series(svgs(document)["Training loss"]) == {"sft v1": 2}
    assert "GRPO reward" not in svgs(document)
    assert document.count("metrics unavailable — ") == 2


def test_an_unreachable_mlflow_server_is_asked_once_per_report(
    sessions: sessionmaker[Session],
    acme: Caller,
    mlflow_store: History,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class CountingReader(MlflowMetricReader):
        calls = 0

        def _read(self, run_id: str) -> RunMetrics:
            CountingReader.calls += 1
            return super()._read(run_id)

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # refused at once, no backoff
    seed(sessions, acme, mlflow_store)
    server = f"http://127.0.0.1:{closed_port()}"
    with sessions() as session:
        found = gather_report(
            session,
            tenant_id=acme.tenant_id,
            domain="billing",
            tracking_uri=server,
            metrics=CountingReader(server),
        )
    assert CountingReader.calls == 1
    errors = [run.metrics_error for run in found.runs]
    assert errors[3] is None  # the cycle has no MLflow run to read
    assert errors[0] == errors[1] == errors[2]
    assert errors[0] is not None
    assert errors[0].startswith(f"MLflow at {server} is unavailable: ")
    document = render_html(found)
    assert document.count("metrics unavailable — ") == 3
    assert "No loss logged by any run." in document


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unknown_domain_is_not_found(sessions: sessionmaker[Session], acme: Caller) -> None:
    with sessions() as session, pytest.raises(NotFound, match="'payroll' not found"):
        gather_report(session, tenant_id=acme.tenant_id, domain="payroll", tracking_uri="unused")


def test_write_report_replaces_the_file_atomically(
    sessions: sessionmaker[Session], acme: Caller, mlflow_store: History, tmp_path: Path
) -> None:
    seed(sessions, acme, mlflow_store)
    out = tmp_path / "deep" / "reports" / "billing.html"
    settings = Settings(home=tmp_path / "home", mlflow_tracking_uri=mlflow_store.tracking_uri)
    assert (
        write_report(
            sessions, tenant_id=acme.tenant_id, domain="billing", settings=settings, out=out
        )
        == out
    )
    first = out.read_text(encoding="utf-8")
    assert first.startswith("<!DOCTYPE html>")
    assert series(svgs(first)["Training loss"]) == {"sft v1": 5, "grpo v2": 3}
    write_report(sessions, tenant_id=acme.tenant_id, domain="billing", settings=settings, out=out)
    assert [path.name for path in out.parent.iterdir()] == ["billing.html"]  # no temp left over


def test_the_cli_writes_to_the_workspace_and_prints_the_path(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    mlflow_store: History,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed(on_test_database, acme, mlflow_store)
    home = tmp_path / "workspace"
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.setenv("FLYWHEEL_MLFLOW_TRACKING_URI", mlflow_store.tracking_uri)
    app = typer.Typer()
    app.command()(report)
    runner = CliRunner()

    result = runner.invoke(app, ["--domain", "billing", "--json"])
    assert result.exit_code == 0, result.output
    written = Path(json.loads(result.stdout)["report"])
    assert written == home / "reports" / "billing.html"
    document = written.read_text(encoding="utf-8")
    assert "Champion | v1 (promoted" in " ".join(rows(section(document, "summary")))

    chosen = tmp_path / "elsewhere.html"
    result = runner.invoke(app, ["--domain", "billing", "--tenant", "acme", "--out", str(chosen)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(chosen)
    assert "metrics unavailable" in chosen.read_text(encoding="utf-8")

    result = runner.invoke(app, ["--domain", "payroll"])
    assert isinstance(result.exception, NotFound)


def test_report_shows_every_slice_before_and_after(
    sessions: sessionmaker[Session], acme: Caller, mlflow_store: History
) -> None:
    seed(sessions, acme, mlflow_store)
    ids = [f"item-{i:03d}" for i in range(100)]
    slices = {item: ["source:feedback", "skill:carry" if i < 60 else "skill:no-carry"]
              for i, item in enumerate(ids)}  # fmt: skip
    old = {item: float(i >= 60) for i, item in enumerate(ids)}
    new = {item: float(i < 30 or i >= 64) for i, item in enumerate(ids)}
    decision = decide(
        Evaluation({"pass@1": new}, slices), Evaluation({"pass@1": old}, slices),
        GatePolicy(primary_metric="pass@1", min_slice_items=40),
    )  # fmt: skip
    with unit_of_work(sessions) as session:
        second = session.scalars(select(ModelVersion).where(ModelVersion.version == "2")).one()
        second.gate_result = {"is_promoted": decision.is_promoted, "reasons": decision.reasons,
                              "against": "1", "evidence": decision.evidence}  # fmt: skip
    with sessions() as session:
        found = gather_report(
            session, tenant_id=acme.tenant_id, domain="billing",
            tracking_uri=mlflow_store.tracking_uri,
        )  # fmt: skip
    document = render_html(found)

    assert "Slices of v2 against v1 (pass@1): before / after" in document
    assert rows(section(document, "slices-v2")) == [
        "skill:carry | 60 | 0.0000 | 0.5000 | +0.5000 | 0.0000 | yes | no",
        "skill:no-carry | 40 | 1.0000 | 0.9000 | -0.1000 | 0.0000 | yes | no",
        "source:feedback | 100 | 0.4000 | 0.6600 | +0.2600 | 0.0000 | yes | no",
    ]

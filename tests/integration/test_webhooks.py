"""Webhooks to serving stacks: each champion move is announced once it commits, signed, to a
real loopback receiver that checks the signature; retried with backoff, recorded failed after
the last attempt (the move stands), never sent for a move that rolled back."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work
from flywheel.errors import InvalidInput, RegistryUnavailable
from flywheel.models import Domain, PromotionEvent, WebhookDelivery
from flywheel.registry import service, webhooks
from flywheel.registry.mlflow_registry import MlflowRegistry
from flywheel.scheduling.jobs import WEBHOOKS_TASK, make_job_app
from flywheel.settings import Settings
from flywheel.tenancy.service import get_domain
from tests.conftest import Caller, run_cli
from tests.integration.test_registry import PASSED, _free_port, register
from tests.integration.test_watch import served

SECRET = "s3cret-for-tests"


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    is_signed: bool
    at: float


@dataclass
class Receiver:
    """A serving stack's webhook endpoint: answers the scripted codes in turn (then 200) and
    keeps what it received, with whether the signature verified."""

    url: str
    codes: list[int] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)

    def payloads(self) -> list[dict[str, object]]:
        return [json.loads(item.body) for item in self.received]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with serve_receiver() as state:
        yield state


@contextmanager
def serve_receiver() -> Iterator[Receiver]:
    """A receiver on a loopback port, in a thread, for the block."""
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            signed = webhooks.verify_signature(SECRET, body, self.headers["X-Flywheel-Signature"])
            headers = dict(self.headers.items())
            state.received.append(Received(headers, body, signed, time.monotonic()))
            code = state.codes.pop(0) if state.codes else (200 if signed else 401)
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/flywheel"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def tracking_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    return f"sqlite:///{home / 'mlflow.db'}"


def configure(monkeypatch: pytest.MonkeyPatch, *urls: str, **more: str) -> None:
    monkeypatch.setenv("FLYWHEEL_WEBHOOK_URLS", ",".join(urls))
    monkeypatch.setenv("FLYWHEEL_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("FLYWHEEL_WEBHOOK_BACKOFF_S", more.pop("backoff", "0.05"))
    for name, value in more.items():
        monkeypatch.setenv(f"FLYWHEEL_WEBHOOK_{name.upper()}", value)


def deliveries(sessions: sessionmaker[Session]) -> list[WebhookDelivery]:
    with sessions() as session:
        return list(session.scalars(select(WebhookDelivery).order_by(WebhookDelivery.created_at)))


def test_a_promotion_and_a_rollback_each_send_one_signed_webhook(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    registry = MlflowRegistry(tracking_uri)
    first = register(on_test_database, registry, acme, tmp_path, "first", PASSED)
    register(on_test_database, registry, acme, tmp_path, "second", PASSED)
    assert run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")[0] == 0
    assert receiver.received == []  # no URL configured yet: nothing sent, nothing recorded
    configure(monkeypatch, receiver.url)

    code, out, err = run_cli(
        capsys, "models", "promote", "--domain", "billing", "--to", "2", "--reason", "better",
        "--json",
    )  # fmt: skip

    assert code == 0, err
    assert json.loads(out)["webhooks"]["delivered"] == 1
    assert len(receiver.received) == 1
    sent = receiver.received[0]
    assert sent.is_signed
    assert sent.headers["X-Flywheel-Event"] == "promoted"
    envelope = receiver.payloads()[0]
    data = envelope["data"]
    assert isinstance(data, dict)
    with on_test_database() as session:
        event = service.latest_champion_event(
            session, get_domain(session, acme.tenant_id, "billing").id
        )
        assert event is not None
    assert data == {
        "domain": "billing",
        "tenant": "acme",
        "action": "promote",
        "registered_model": "acme.billing",
        "from_version": "1",
        "to_version": "2",
        "model_version_id": data["model_version_id"],
        "adapter_uri": data["adapter_uri"],
        "base_model": "/models/tiny",
        "registry_uri": "models:/acme.billing@champion",
        "actor": data["actor"],
        "reason": "better",
        "is_forced": False,
        "promotion_event_id": str(event.id),
        "promoted_at": event.created_at.isoformat(),
    }
    assert str(data["actor"]).startswith("cli:")
    assert str(data["adapter_uri"]).startswith("runs:/")
    assert str(data["adapter_uri"]).endswith("/adapter")
    (row,) = deliveries(on_test_database)
    assert sent.headers["X-Flywheel-Delivery"] == envelope["delivery_id"] == str(row.id)
    assert (row.status, row.attempts, row.last_status_code) == ("delivered", 1, 200)
    assert row.delivered_at is not None

    assert run_cli(capsys, "models", "rollback", "--domain", "billing")[0] == 0

    assert len(receiver.received) == 2
    assert receiver.received[1].is_signed
    assert receiver.received[1].headers["X-Flywheel-Event"] == "rolled_back"
    back = receiver.payloads()[1]["data"]
    assert isinstance(back, dict)
    assert (back["action"], back["from_version"], back["to_version"]) == ("rollback", "2", "1")
    assert back["adapter_uri"] == first.adapter_uri


def test_a_receiver_failing_twice_gets_it_on_the_third_attempt_after_backoff(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    register(on_test_database, MlflowRegistry(tracking_uri), acme, tmp_path, "a", PASSED)
    configure(monkeypatch, receiver.url, backoff="0.2")
    receiver.codes = [500, 500]

    assert run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")[0] == 0

    assert [item.is_signed for item in receiver.received] == [True, True, True]
    ids = {item.headers["X-Flywheel-Delivery"] for item in receiver.received}
    assert len(ids) == 1  # one delivery, retried: the receiver dedupes on its id
    gaps = [b.at - a.at for a, b in zip(receiver.received, receiver.received[1:], strict=False)]
    assert gaps[0] >= 0.1  # 50-100% of 0.2 s
    assert gaps[1] >= 0.2  # 50-100% of 0.4 s
    (row,) = deliveries(on_test_database)
    assert (row.status, row.attempts, row.last_status_code) == ("delivered", 3, 200)
    stamps = [str(p["timestamp"]) for p in receiver.payloads()]
    assert len(set(stamps)) == 3  # each attempt signs its own time


def test_a_receiver_that_is_down_is_recorded_failed_and_the_promotion_stands(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    register(on_test_database, MlflowRegistry(tracking_uri), acme, tmp_path, "a", PASSED)
    down = f"http://127.0.0.1:{_free_port()}/hook"
    configure(monkeypatch, down, max_attempts="3", backoff="0.01", timeout_s="2")

    code, out, err = run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")

    assert code == 0, err
    assert "champion is now v1" in out
    (row,) = deliveries(on_test_database)
    assert (row.status, row.attempts, row.last_status_code) == ("failed", 3, None)
    assert row.last_error is not None
    assert "ConnectError" in row.last_error
    assert row.next_attempt_at is None
    with on_test_database() as session:
        assert len(session.scalars(select(PromotionEvent)).all()) == 1
    code, out, _ = run_cli(
        capsys, "models", "webhooks", "list", "--domain", "billing", "--status", "failed", "--json"
    )
    assert code == 0
    assert [(d["status"], d["attempts"], d["url"]) for d in json.loads(out)] == [
        ("failed", 3, down)
    ]


def test_a_move_that_rolled_back_announces_nothing(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    register(on_test_database, MlflowRegistry(tracking_uri), acme, tmp_path, "a", PASSED)
    configure(monkeypatch, receiver.url)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    unreachable = MlflowRegistry(f"http://127.0.0.1:{_free_port()}")

    with pytest.raises(RegistryUnavailable), unit_of_work(on_test_database) as session:
        service.promote(
            session=session, registry=unreachable,
            domain=get_domain(session, acme.tenant_id, "billing"), version="1", actor="t",
        )  # fmt: skip
    report = webhooks.deliver_due(on_test_database, budget_s=0.5)

    assert deliveries(on_test_database) == []
    assert receiver.received == []
    assert report.delivered == report.failed == 0


def test_the_deliver_command_retries_what_is_due(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The promotion's own sending gives up at its budget; `webhooks deliver` finishes it."""
    register(on_test_database, MlflowRegistry(tracking_uri), acme, tmp_path, "a", PASSED)
    configure(monkeypatch, receiver.url, backoff="0.3", send_budget_s="0")
    receiver.codes = [503]

    assert run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")[0] == 0
    (waiting,) = deliveries(on_test_database)
    assert (waiting.status, waiting.attempts, waiting.last_status_code) == ("pending", 1, 503)
    assert waiting.last_error == "HTTP 503"

    code, out, err = run_cli(
        capsys, "models", "webhooks", "deliver", "--domain", "billing", "--budget-s", "5", "--json"
    )

    assert code == 0, err
    assert json.loads(out)["delivered"] == 1
    (row,) = deliveries(on_test_database)
    assert (row.status, row.attempts) == ("delivered", 2)
    assert [item.is_signed for item in receiver.received] == [True, True]


def test_without_a_secret_nothing_is_sent_and_deliver_says_why(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    register(on_test_database, MlflowRegistry(tracking_uri), acme, tmp_path, "a", PASSED)
    monkeypatch.setenv("FLYWHEEL_WEBHOOK_URLS", receiver.url)

    assert run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")[0] == 0
    code, out, err = run_cli(capsys, "models", "webhooks", "deliver")

    assert receiver.received == []
    assert [row.status for row in deliveries(on_test_database)] == ["pending"]  # kept for later
    assert code != 0
    assert out == ""
    assert "FLYWHEEL_WEBHOOK_SECRET is not set" in err
    assert len(err.strip().splitlines()) == 1


def test_a_domain_config_adds_its_own_urls_and_a_bad_one_is_refused(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    register(on_test_database, MlflowRegistry(tracking_uri), acme, tmp_path, "a", PASSED)
    configure(monkeypatch)  # a secret, no deployment-wide URL
    with unit_of_work(on_test_database) as session:
        domain = session.scalars(select(Domain).where(Domain.tenant_id == acme.tenant_id)).one()
        domain.config = {"webhooks": [receiver.url]}

    assert run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")[0] == 0

    assert [item.is_signed for item in receiver.received] == [True]
    bad = Domain(name="billing", config={"webhooks": ["ftp://x", "not a url"]})
    with pytest.raises(InvalidInput, match=r"billing's webhooks config: 0: "):
        webhooks.domain_webhooks(bad)


@pytest.mark.parametrize("listed", ["webhooks: [ftp://x]", "webhooks: 'http://a'", "webhooks: [1]"])
def test_configure_refuses_a_bad_webhooks_list_in_one_line(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    listed: str,
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(listed, encoding="utf-8")

    code, _, err = run_cli(
        capsys, "domains", "configure", "billing", "--tenant", "acme", "--file", str(path)
    )

    assert code != 0
    assert "billing's webhooks config" in err
    assert len(err.strip().splitlines()) == 1
    with on_test_database() as session:
        assert get_domain(session, acme.tenant_id, "billing").config == {}


@pytest.mark.postgres_only
def test_the_workers_periodic_task_delivers_what_is_due(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    settings: Settings,
    tracking_uri: str,
    tmp_path: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A move whose webhook could not be sent at once (here: a cycle's, or a 503) is sent by
    the worker's every-minute task."""
    register(on_test_database, MlflowRegistry(tracking_uri), acme, tmp_path, "a", PASSED)
    configure(monkeypatch, receiver.url, backoff="0.01", send_budget_s="0")
    receiver.codes = [503]
    assert run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")[0] == 0
    assert [row.status for row in deliveries(on_test_database)] == ["pending"]
    app = make_job_app(
        settings.model_copy(update={"webhook_secret": SecretStr(SECRET)}), on_test_database
    )

    result = app.tasks[WEBHOOKS_TASK].func(timestamp=int(time.time()))

    assert result == {"delivered": 1, "failed": 0, "retried": 0, "errors": []}
    assert [row.status for row in deliveries(on_test_database)] == ["delivered"]
    assert [item.is_signed for item in receiver.received] == [True, True]


def test_a_sender_without_budget_leaves_a_retry_that_fell_due_meanwhile(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A budget of 0 sends what was due when the sender started, once: a retry whose backoff
    ran out during the call (at once here, backoff 0; on a loaded machine a short one did) is
    left for a later sender, not sent in the same breath."""
    register(on_test_database, MlflowRegistry(tracking_uri), acme, tmp_path, "a", PASSED)
    configure(monkeypatch, receiver.url, backoff="0", send_budget_s="0")
    receiver.codes = [503]

    assert run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")[0] == 0

    assert [row.status for row in deliveries(on_test_database)] == ["pending"]
    assert len(receiver.received) == 1


def test_an_automatic_rollback_by_the_watch_is_announced(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    registry = MlflowRegistry(tracking_uri)
    register(on_test_database, registry, acme, tmp_path, "one", PASSED)
    register(on_test_database, registry, acme, tmp_path, "two", PASSED)
    for version in ("1", "2"):
        assert run_cli(capsys, "models", "promote", "--domain", "billing", "--to", version)[0] == 0
    served(on_test_database, acme, "1", ups=40, downs=10)
    served(on_test_database, acme, "2", ups=20, downs=30)
    with unit_of_work(on_test_database) as session:
        get_domain(session, acme.tenant_id, "billing").config = {"auto_rollback": True}
    configure(monkeypatch, receiver.url)

    code, out, err = run_cli(capsys, "models", "watch", "--domain", "billing", "--json")

    assert code == 0, err
    assert json.loads(out)["rolled_back_to"] == "1"
    assert [item.headers["X-Flywheel-Event"] for item in receiver.received] == ["rolled_back"]
    assert receiver.received[0].is_signed
    data = receiver.payloads()[0]["data"]
    assert isinstance(data, dict)
    assert (data["action"], data["actor"], data["to_version"]) == ("auto_rollback", "watch", "1")


def test_two_senders_never_send_the_same_attempt(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claim is a compare-and-set on the attempt count: of two senders that read the same
    due row, one takes it; the other's claim changes nothing."""
    register(on_test_database, MlflowRegistry(tracking_uri), acme, tmp_path, "a", PASSED)
    configure(monkeypatch, receiver.url)
    with unit_of_work(on_test_database) as session:
        service.promote(
            session=session, registry=MlflowRegistry(tracking_uri),
            domain=get_domain(session, acme.tenant_id, "billing"), version="1", actor="t",
        )  # fmt: skip
    with on_test_database() as reader:
        seen = reader.scalars(select(WebhookDelivery)).one()  # what the second sender read
    with unit_of_work(on_test_database) as first:
        assert webhooks._claim(first, first.scalars(select(WebhookDelivery)).one(), claim_s=60)
    with unit_of_work(on_test_database) as second:
        stale = second.merge(seen, load=False)
        assert stale.attempts == 0
        assert not webhooks._claim(second, stale, claim_s=60)
    (row,) = deliveries(on_test_database)
    assert row.attempts == 1
    assert webhooks.deliver_due(on_test_database, budget_s=0.2).delivered == 0  # claimed: not due
    assert receiver.received == []


def test_deliver_names_what_failed_in_one_line(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tracking_uri: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    register(on_test_database, MlflowRegistry(tracking_uri), acme, tmp_path, "a", PASSED)
    down = f"http://127.0.0.1:{_free_port()}/hook"
    configure(monkeypatch, down, max_attempts="2", backoff="0.01", send_budget_s="0")
    assert run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")[0] == 0

    code, out, err = run_cli(capsys, "models", "webhooks", "deliver", "--budget-s", "2")

    assert code == 1
    assert "0 delivered, 1 failed" in out
    assert err.strip().splitlines() == [
        "error: 1 webhook deliveries failed after their last attempt "
        "(flywheel models webhooks list --status failed)"
    ]
    bad = run_cli(capsys, "models", "webhooks", "list", "--domain", "billing", "--status", "lost")
    assert bad[0] == 2
    assert len(bad[2].strip().splitlines()) == 1

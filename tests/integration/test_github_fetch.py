"""`flywheel ingest tickets --from-github owner/repo` against a fake of the GitHub REST API: a
real HTTP server on loopback that serves the fixture's issues, comments and events in the
API's shapes, pages them with `Link` headers, counts down `X-RateLimit-*` headers, answers
403/429 when told to, and records every request. The fetch pages, waits out or stops at rate
limits, resumes without fetching or writing anything twice, never lets the token out, and
what it fetched ingests like the same issues exported by hand."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.errors import InvalidInput, InvalidState, RateLimited
from flywheel.models import SftExample
from ingest.framework import Ingestor, Rejected
from ingest.tickets import make_ticket_ingestor
from ingest.tickets.github_api import GithubApi, fetch_issues
from tests.conftest import Caller, run_cli

FIXTURES = Path(__file__).parent.parent / "fixtures" / "tickets"
REPOSITORY = "acme/widgets"
TOKEN = "ghp_fakeTokenForTheTestServer0123456789"
NOW = 1_800_000_000.0


def fixture_issues() -> list[dict[str, Any]]:
    """The hand-made export, less #17 (its comments exist only as a count there)."""
    issues = json.loads((FIXTURES / "github_issues.json").read_text(encoding="utf-8"))
    return [issue for issue in issues if issue["number"] != 17]


@dataclass
class FakeGithub:
    """What the fake API serves and what it was asked."""

    issues: list[dict[str, Any]]
    page_size: int = 2
    budget: int = 5_000
    refusals: dict[int, tuple[int, dict[str, str]]] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    url: str = ""

    def answer(self, target: str, authorization: str | None) -> tuple[int, dict[str, str], Any]:
        self.requests.append((target, authorization))
        refusal = self.refusals.pop(len(self.requests), None)
        if refusal is not None:
            return refusal[0], refusal[1], {"message": "API rate limit exceeded for user."}
        self.budget -= 1
        limits = {
            "X-RateLimit-Limit": "5000",
            "X-RateLimit-Remaining": str(self.budget),
            "X-RateLimit-Reset": str(int(NOW) + 3600),
        }
        if authorization != f"Bearer {TOKEN}":
            return 401, limits, {"message": "Bad credentials"}
        parts = urlsplit(target)
        query = {key: values[0] for key, values in parse_qs(parts.query).items()}
        items = self._items(parts.path, query)
        if items is None:
            return 404, limits, {"message": "Not Found"}
        size = min(int(query.get("per_page", 30)), self.page_size)
        page = int(query.get("page", 1))
        headers = limits | self._link(parts.path, query, page, -(-len(items) // size))
        return 200, headers, items[(page - 1) * size : page * size]

    def _items(self, path: str, query: dict[str, str]) -> list[Any] | None:
        base = f"/repos/{REPOSITORY}/issues"
        if path == base:
            since = query.get("since", "")
            return [self._listed(i) for i in self.issues if i["updated_at"] >= since]
        for issue in self.issues:
            if path == f"{base}/{issue['number']}/comments":
                return list(issue["comments"])
            if path == f"{base}/{issue['number']}/events":
                return list(issue.get("events", []))
        return None

    @staticmethod
    def _listed(issue: dict[str, Any]) -> dict[str, Any]:
        """As GET /repos/o/r/issues lists it: a comment count, no events."""
        listed = {key: value for key, value in issue.items() if key != "events"}
        return listed | {"comments": len(issue["comments"])}

    def _link(self, path: str, query: dict[str, str], page: int, last: int) -> dict[str, str]:
        def url(number: int) -> str:
            params = "&".join(f"{k}={v}" for k, v in (query | {"page": str(number)}).items())
            return f"{self.url}{path}?{params}"

        links = [f'<{url(page + 1)}>; rel="next"', f'<{url(last)}>; rel="last"']
        return {"Link": ", ".join(links)} if page < last else {}


@pytest.fixture
def github() -> Iterator[FakeGithub]:
    fake = FakeGithub(fixture_issues())

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, headers, body = fake.answer(self.path, self.headers.get("Authorization"))
            data = json.dumps(body).encode()
            self.send_response(status)
            for name, value in (headers | {"Content-Type": "application/json"}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


class Clock:
    """The fetch's clock and sleep: waits are recorded and pass at once."""

    def __init__(self) -> None:
        self.now, self.slept = NOW, []  # type: ignore[var-annotated]

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def api(github: FakeGithub, clock: Clock, max_wait_s: float = 120.0) -> GithubApi:
    return GithubApi(
        github.url, TOKEN, max_wait_s=max_wait_s, sleep=clock.sleep, clock=lambda: clock.now
    )


def saved_numbers(state: Path) -> list[int]:
    lines = (state / "issues.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["number"] for line in lines]


def convert_all(ingestor: Ingestor) -> list[Any]:
    results: list[Any] = []
    for record in ingestor.records():
        try:
            results.append(ingestor.convert(record))
        except Rejected as rejected:
            results.append(rejected.reason)
    return results


def test_the_fetch_pages_and_gives_what_the_hand_made_export_gives(
    github: FakeGithub, tmp_path: Path
) -> None:
    hand_made = tmp_path / "hand_made.json"
    hand_made.write_text(json.dumps(fixture_issues()), encoding="utf-8")

    result = fetch_issues(api(github, Clock()), REPOSITORY, tmp_path / "state")

    assert (result.issues, result.fetched, result.is_resumed) == (6, 6, False)
    assert convert_all(make_ticket_ingestor("github", result.path)) == convert_all(
        make_ticket_ingestor("github", hand_made)
    )
    paths = [urlsplit(target).path for target, _ in github.requests]
    assert paths.count(f"/repos/{REPOSITORY}/issues") == 3  # 6 issues, 2 a page
    assert f"/repos/{REPOSITORY}/issues/14/comments" not in paths  # a pull request
    assert f"/repos/{REPOSITORY}/issues/16/events" not in paths  # open: no reopen history
    assert paths.count(f"/repos/{REPOSITORY}/issues/12/comments") == 2  # 4 comments, 2 a page
    assert result.requests == len(github.requests)
    assert {authorization for _, authorization in github.requests} == {f"Bearer {TOKEN}"}


def test_a_rate_limit_is_waited_out_as_the_headers_say(github: FakeGithub, tmp_path: Path) -> None:
    github.refusals = {
        2: (429, {"Retry-After": "7"}),  # secondary limit
        5: (403, {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(NOW) + 90)}),
    }
    clock = Clock()

    result = fetch_issues(api(github, clock), REPOSITORY, tmp_path / "state")

    assert clock.slept == [7.0, 83.0]  # 90 s after NOW, less the 7 already waited
    assert result.issues == 6
    assert len(github.requests) == result.requests


def test_a_spent_budget_waits_for_the_reset_before_the_next_request(
    github: FakeGithub, tmp_path: Path
) -> None:
    github.budget = 3  # the third request leaves 0
    clock = Clock()

    fetch_issues(api(github, clock, max_wait_s=4_000), REPOSITORY, tmp_path / "state")

    assert clock.slept == [3600.0]
    assert github.budget < 0  # (the fake does not refuse, the client waited anyway)


def test_a_long_rate_limit_stops_and_a_rerun_continues_without_repeats(
    github: FakeGithub, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    github.refusals = {
        9: (403, {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(NOW) + 1800)})
    }

    with pytest.raises(RateLimited) as stopped:
        fetch_issues(api(github, Clock()), REPOSITORY, state)

    message = stopped.value.message
    assert "30-minute wait" in message
    assert f"in {state}: run the same command again" in message
    assert TOKEN not in message
    saved = saved_numbers(state)
    assert 0 < len(saved) < 6
    before = list(github.requests)

    result = fetch_issues(api(github, Clock()), REPOSITORY, state)

    numbers = saved_numbers(state)
    assert numbers == [issue["number"] for issue in fixture_issues()]  # each once, in order
    assert (result.fetched, result.is_resumed) == (6 - len(saved), True)
    again = github.requests[len(before) :]
    assert before[-1][0] == again[0][0]  # the refused request is the first one made again
    fetched_threads = {t for t, _ in before[:-1] if "/comments" in t or "/events" in t}
    assert not fetched_threads & {t for t, _ in again}
    for path in state.iterdir():
        assert TOKEN not in path.read_text(encoding="utf-8")

    refreshed = fetch_issues(api(github, Clock()), REPOSITORY, state)
    assert (refreshed.fetched, refreshed.requests, refreshed.issues) == (0, 1, 6)
    assert "since=" in github.requests[-1][0]


def test_a_refresh_fetches_what_changed_and_the_latest_copy_is_read(
    github: FakeGithub, tmp_path: Path
) -> None:
    """After a complete fetch, #16 (open) is answered and closed: the next fetch asks for
    the issues updated since the first began, appends #16's new state, and the reader takes
    it over the old copy."""
    state = tmp_path / "state"
    fetch_issues(api(github, Clock()), REPOSITORY, state)
    sixteen = next(issue for issue in github.issues if issue["number"] == 16)
    answer = dict(sixteen["comments"][0], id=9302, body="Fixed in 2.4.0: dark mode is on.")
    sixteen.update(
        state="closed",
        state_reason="completed",
        updated_at="2027-02-01T00:00:00Z",  # after the first fetch began (the clock's NOW)
        comments=[*sixteen["comments"], answer],
        events=[{"id": 1, "event": "closed", "created_at": "2027-02-01T00:00:00Z"}],
    )
    before = len(github.requests)

    result = fetch_issues(api(github, Clock()), REPOSITORY, state)

    assert (result.fetched, result.issues, result.since) == (1, 6, "2027-01-15T08:00:00Z")
    targets = [urlsplit(t) for t, _ in github.requests[before:]]
    assert [t.path.rsplit("/", 1)[-1] for t in targets] == ["issues", "comments", "events"]
    assert "since=2027-01-15T08:00:00Z" in targets[0].query
    results = convert_all(make_ticket_ingestor("github", result.path))
    assert results[4] == "superseded"  # the old copy of #16
    assert isinstance(results[-1], list)
    assert results[-1][0].completion == "Fixed in 2.4.0: dark mode is on."


def test_a_line_cut_short_by_a_crash_is_fetched_again(github: FakeGithub, tmp_path: Path) -> None:
    state = tmp_path / "state"
    fetch_issues(api(github, Clock()), REPOSITORY, state)
    lines = (state / "issues.jsonl").read_bytes().splitlines(keepends=True)
    (state / "issues.jsonl").write_bytes(b"".join(lines[:3]) + lines[3][:40])
    (state / "state.json").write_text(
        json.dumps({"repository": REPOSITORY, "next_url": None, "is_complete": False})
    )

    result = fetch_issues(api(github, Clock()), REPOSITORY, state)

    numbers = saved_numbers(state)
    assert numbers == [issue["number"] for issue in fixture_issues()]
    assert result.fetched == 3


@pytest.mark.parametrize(
    ("token", "repository", "message"),
    [
        ("wrong", REPOSITORY, "GitHub refused the token (401 Bad credentials)"),
        (TOKEN, "acme/nothing", "GitHub answered 404 for /repos/acme/nothing/issues (Not Found)"),
    ],
)
def test_refusals_are_one_sentence_without_the_token(
    github: FakeGithub, tmp_path: Path, token: str, repository: str, message: str
) -> None:
    client = GithubApi(github.url, token)

    with pytest.raises(InvalidInput) as error:
        fetch_issues(client, repository, tmp_path / "state")

    assert error.value.message.startswith(message)
    assert token not in error.value.message


def test_a_next_page_on_another_host_is_not_followed(github: FakeGithub, tmp_path: Path) -> None:
    original = github._link

    def elsewhere(path: str, query: dict[str, str], page: int, last: int) -> dict[str, str]:
        links = original(path, query, page, last)
        return {"Link": links["Link"].replace("127.0.0.1", "localhost")} if links else {}

    github._link = elsewhere  # type: ignore[method-assign]

    with pytest.raises(InvalidState, match=r"next page on another host \(http://localhost:"):
        fetch_issues(api(github, Clock()), REPOSITORY, tmp_path / "state")
    assert [t for t, _ in github.requests if "page=2" in t] == []


# Through the CLI, into the database ----------------------------------------------------------


def test_ingest_tickets_from_github_goes_in_once(
    github: FakeGithub,
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("FLYWHEEL_GITHUB_API_URL", github.url)
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    args = ["ingest", "tickets", "--from-github", REPOSITORY, "--domain", "billing", "--json"]

    code, out, err = run_cli(capsys, *args)

    assert code == 0, err
    first = json.loads(out)
    assert first["read"] == 6
    assert first["rejected"] == {"pull_request": 1, "not_planned": 1, "unresolved": 1}
    assert first["accepted"]["sft_examples"] == 3
    assert (tmp_path / "home" / "github" / "acme+widgets" / "issues.jsonl").exists()
    assert TOKEN not in out + err
    with on_test_database() as session:
        groups = set(session.scalars(select(SftExample.group_key)))
    assert groups == {f"github:{REPOSITORY}#{n}" for n in (12, 13, 18)}

    requests = len(github.requests)
    code, out, err = run_cli(capsys, *args)

    assert code == 0, err
    assert len(github.requests) == requests + 1  # the fetch was complete: what changed since?
    again = json.loads(out)
    assert again["accepted"] == {}
    assert again["duplicate"] == sum(first["accepted"].values())


def test_a_stopped_fetch_fails_in_one_line_and_the_rerun_ingests_everything(
    github: FakeGithub,
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("FLYWHEEL_GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("FLYWHEEL_GITHUB_API_URL", github.url)
    state = tmp_path / "fetch"
    args = ["ingest", "tickets", "--from-github", REPOSITORY, "--github-state", str(state)]
    args += ["--max-rate-wait", "5", "--domain", "billing", "--json"]
    github.refusals = {4: (429, {"Retry-After": "600"})}

    code, out, err = run_cli(capsys, *args)

    assert code == 1
    assert out == ""
    assert err.startswith("error: GitHub's rate limit asks for a 10-minute wait")
    assert len(err.strip().splitlines()) == 1
    assert TOKEN not in err

    code, out, err = run_cli(capsys, *args)

    assert code == 0, err
    assert json.loads(out)["read"] == 6
    assert saved_numbers(state) == [issue["number"] for issue in fixture_issues()]


def test_a_wrong_domain_fails_before_any_request(
    github: FakeGithub,
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("FLYWHEEL_GITHUB_API_URL", github.url)
    args = ["--from-github", REPOSITORY, "--github-state", str(tmp_path / "fetch")]

    code, _, err = run_cli(capsys, "ingest", "tickets", *args, "--domain", "nope")

    assert code == 2  # a name that does not exist: bad input
    assert "nope" in err
    assert github.requests == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from-github", "not-a-repo"], "--from-github takes owner/repo, not 'not-a-repo'"),
        (["--from-github", REPOSITORY, "--format", "jira"], "--from-github takes no export file"),
        ([], "give an export file and its --format, or --from-github owner/repo"),
    ],
)
def test_bad_from_github_arguments_fail_in_one_line(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    code, _, err = run_cli(capsys, "ingest", "tickets", *args, "--domain", "billing")

    assert code != 0
    assert message in err
    assert len(err.strip().splitlines()) == 1

"""A repository's issues, with their comments and events, fetched from the GitHub REST API
into the export `ingest.tickets.github` reads (one issue per line, `comments` and `events`
embedded), for `flywheel ingest tickets --from-github owner/repo`.

- Token: `FLYWHEEL_GITHUB_TOKEN`, else `GITHUB_TOKEN` (none: unauthenticated, 60 requests an
  hour). It is sent only to the API's own host, in the Authorization header, and never
  written to a file, a message or the log. `FLYWHEEL_GITHUB_API_URL` points elsewhere
  (GitHub Enterprise: https://host/api/v3).
- Paging: `GET /repos/{owner}/{repo}/issues?state=all&sort=created&direction=asc` 100 at a
  time, following the `Link: <...>; rel="next"` header; per issue, its comments (when it has
  any) and, when closed, its events (reopen history), each paged the same way. Oldest first,
  so issues opened during the fetch land on later pages instead of shifting earlier ones.
- Rate limits: a 403 or 429 waits `Retry-After` seconds when given, else until
  `X-RateLimit-Reset` when `X-RateLimit-Remaining` is 0, else a minute (a secondary limit
  without headers); a response leaving 0 requests waits for the reset before the next
  request. A wait longer than `max_wait_s` stops the fetch with what to do and when.
- Resuming: each issue is appended to `issues.jsonl` once complete, and `state.json` keeps
  the page being read; a rerun continues at that page and skips issues the pass already
  wrote, so nothing is fetched or written twice.
- Refreshing: once a fetch is complete, the next run fetches only the issues updated since
  it began (`since=`), appended; the reader takes each issue's last copy (the earlier ones
  are rejected `superseded`), and the store keeps what did not change as it was.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from flywheel.errors import InvalidInput, InvalidState, RateLimited

API_URL = "https://api.github.com"
TOKEN_VARIABLES = ("FLYWHEEL_GITHUB_TOKEN", "GITHUB_TOKEN")
API_URL_VARIABLE = "FLYWHEEL_GITHUB_API_URL"
PER_PAGE = 100
SECONDARY_WAIT_S = 60.0
MAX_RETRIES = 5
_REPOSITORY = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")

Sleep = Callable[[float], None]
Clock = Callable[[], float]
Progress = Callable[[int], None]


class RateLimitWait(Exception):
    """GitHub asks for a wait longer than the fetch may take."""

    def __init__(self, wait_s: float, resets_at: float) -> None:
        super().__init__(f"wait {wait_s:.0f} s")
        self.wait_s, self.resets_at = wait_s, resets_at


class GithubApi:
    """GET requests to the REST API, paged by `Link` and patient with rate limits."""

    def __init__(
        self,
        api_url: str = API_URL,
        token: str | None = None,
        *,
        max_wait_s: float = 60.0,
        sleep: Sleep = time.sleep,
        clock: Clock = time.time,
        timeout_s: float = 30.0,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self._origin = _origin(self.api_url)
        headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._client = httpx.Client(headers=headers, timeout=timeout_s, follow_redirects=False)
        self._max_wait_s, self._sleep, self._clock = max_wait_s, sleep, clock
        self._blocked_until = 0.0
        self.requests = 0

    def close(self) -> None:
        self._client.close()

    def now(self) -> float:
        return self._clock()

    def page(self, url: str) -> tuple[list[Any], str | None]:
        """The page's items and the next page's URL (None on the last)."""
        response = self.get(url)
        try:
            items = response.json()
        except ValueError as error:
            raise InvalidState(f"GitHub answered {_path(url)} with no JSON") from error
        if not isinstance(items, list):
            raise InvalidState(f"GitHub answered {_path(url)} with no list")
        return items, self._next(response)

    def get_all(self, url: str) -> list[Any]:
        """Every item of every page, from `url` on."""
        items: list[Any] = []
        next_url: str | None = url
        while next_url is not None:
            page, next_url = self.page(next_url)
            items += page
        return items

    def get(self, url: str) -> httpx.Response:
        for _ in range(MAX_RETRIES):
            self._wait(self._blocked_until - self._clock())
            response = self._request(url)
            if response.status_code in (403, 429) and _is_rate_limited(response):
                self._wait(self._wait_s(response))
                continue
            if response.is_success:
                self._note_remaining(response)
                return response
            raise _refused(response, url)
        raise InvalidState(f"GitHub kept refusing {_path(url)} for its rate limit; try later")

    def _request(self, url: str) -> httpx.Response:
        if _origin(url) != self._origin:
            raise InvalidState(f"GitHub sent a next page on another host ({_origin(url)})")
        self.requests += 1
        try:
            return self._client.get(url)
        except httpx.HTTPError as error:
            raise InvalidState(f"cannot reach {self.api_url}: {error}") from error

    def _wait(self, wait_s: float) -> None:
        if wait_s <= 0:
            return
        if wait_s > self._max_wait_s:
            raise RateLimitWait(wait_s, self._clock() + wait_s)
        self._sleep(wait_s)

    def _wait_s(self, response: httpx.Response) -> float:
        headers = response.headers
        if (retry_after := _number(headers.get("retry-after"))) is not None:
            return retry_after
        reset = _number(headers.get("x-ratelimit-reset"))
        if headers.get("x-ratelimit-remaining") == "0" and reset is not None:
            return max(reset - self._clock(), 1.0)
        return SECONDARY_WAIT_S

    def _note_remaining(self, response: httpx.Response) -> None:
        reset = _number(response.headers.get("x-ratelimit-reset"))
        if response.headers.get("x-ratelimit-remaining") == "0" and reset is not None:
            self._blocked_until = reset

    def _next(self, response: httpx.Response) -> str | None:
        link = response.links.get("next")
        return str(link["url"]) if link and link.get("url") else None


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _path(url: str) -> str:
    return urlsplit(url).path


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _is_rate_limited(response: httpx.Response) -> bool:
    """403 is also "no access": a rate limit says so in its headers or its message."""
    headers = response.headers
    if response.status_code == 429 or "retry-after" in headers:
        return True
    if headers.get("x-ratelimit-remaining") == "0":
        return True
    return "rate limit" in response.text.casefold()


def _refused(response: httpx.Response, url: str) -> InvalidInput | InvalidState:
    message = _message(response)
    if response.status_code == 401:
        return InvalidInput(f"GitHub refused the token (401 {message}); check GITHUB_TOKEN")
    if response.status_code in (403, 404):
        return InvalidInput(
            f"GitHub answered {response.status_code} for {_path(url)} ({message}): no such "
            "repository, or the token cannot read it"
        )
    return InvalidState(f"GitHub answered {response.status_code} for {_path(url)} ({message})")


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.reason_phrase
    text = body.get("message") if isinstance(body, dict) else None
    return str(text)[:200] if text else response.reason_phrase


# The fetch -----------------------------------------------------------------------------------


@dataclass
class FetchState:
    """What `state.json` keeps between runs. A pass reads every issue updated since the
    previous pass began (the first pass: all of them); its issues are appended from byte
    `pass_offset` of the export on."""

    repository: str
    next_url: str | None = None  # the page being read; None before the pass's first
    is_complete: bool = False
    pass_started_at: str | None = None  # ISO 8601, when the current (or last) pass began
    since: str | None = None  # the pass reads issues updated at or after this
    pass_offset: int = 0


@dataclass(frozen=True)
class FetchResult:
    path: Path  # the export, one issue per line
    issues: int  # distinct issues in it
    fetched: int  # issues this run fetched
    requests: int
    is_resumed: bool  # continued a pass an earlier run began
    since: str | None  # a refresh: issues updated since then were fetched


def fetch_issues(
    api: GithubApi, repository: str, state_dir: Path, *, progress: Progress | None = None
) -> FetchResult:
    """Fetch the repository's issues into `state_dir/issues.jsonl`: all of them the first
    time, then those updated since the previous fetch began (appended; the reader takes an
    issue's last copy). Continues a pass a rate limit, a crash or Ctrl-C stopped; RateLimited
    when GitHub asks for a longer wait than allowed, with what was fetched kept."""
    check_repository(repository)
    state_dir.mkdir(parents=True, exist_ok=True)
    path, state_path = state_dir / "issues.jsonl", state_dir / "state.json"
    state = _load_state(state_path, repository)
    written = _written_numbers(path)
    is_resumed = state.next_url is not None or (bool(written) and not state.is_complete)
    if state.is_complete or state.pass_started_at is None:
        _begin_pass(state, api, offset=sum(size for _, size in written))
    done = _numbers_from(written, state.pass_offset)
    url: str | None = state.next_url or _first_page(api, repository, state.since)
    fetched = 0
    try:
        with path.open("ab") as out:
            while url is not None:
                state.next_url = url
                _save_state(state_path, state)
                items, url = api.page(url)
                fetched += _write_new(api, repository, items, done, out, progress)
    except RateLimitWait as wait:
        raise _stopped(wait, state_dir) from None
    state.next_url, state.is_complete = None, True
    _save_state(state_path, state)
    issues = len({number for number, _ in _written_numbers(path)})
    return FetchResult(path, issues, fetched, api.requests, is_resumed, state.since)


def _begin_pass(state: FetchState, api: GithubApi, *, offset: int) -> None:
    """A refresh after a complete pass (appending at `offset`), or the first pass."""
    offset = offset if state.is_complete else 0
    state.since = state.pass_started_at if state.is_complete else None
    state.pass_started_at = datetime.fromtimestamp(api.now(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    state.pass_offset, state.next_url, state.is_complete = offset, None, False


def _first_page(api: GithubApi, repository: str, since: str | None) -> str:
    url = f"{api.api_url}/repos/{repository}/issues?state=all&sort=created&direction=asc"
    return f"{url}&per_page={PER_PAGE}" + (f"&since={since}" if since else "")


def _numbers_from(written: list[tuple[int, int]], offset: int) -> set[int]:
    """The numbers of the issues written from byte `offset` on."""
    numbers, position = set(), 0
    for number, size in written:
        if position >= offset:
            numbers.add(number)
        position += size
    return numbers


def _write_new(
    api: GithubApi,
    repository: str,
    issues: list[Any],
    done: set[int],
    out: Any,
    progress: Progress | None,
) -> int:
    written = 0
    for issue in issues:
        number = issue.get("number") if isinstance(issue, dict) else None
        if not isinstance(number, int) or number in done:
            continue
        out.write(orjson.dumps(_with_thread(api, repository, issue)) + b"\n")
        out.flush()
        done.add(number)
        written += 1
        if progress is not None:
            progress(1)
    return written


def _with_thread(api: GithubApi, repository: str, issue: dict[str, Any]) -> dict[str, Any]:
    """The issue with its comments and (closed) its events embedded; pull requests as they
    are (the reader rejects them)."""
    if issue.get("pull_request") is not None:
        return issue
    base = f"{api.api_url}/repos/{repository}/issues/{issue['number']}"
    count = issue.get("comments")
    if isinstance(count, int):
        issue["comments"] = api.get_all(f"{base}/comments?per_page={PER_PAGE}") if count else []
    if issue.get("state") == "closed":
        issue["events"] = api.get_all(f"{base}/events?per_page={PER_PAGE}")
    return issue


def _stopped(wait: RateLimitWait, state_dir: Path) -> RateLimited:
    resets = datetime.fromtimestamp(wait.resets_at, UTC).strftime("%H:%M UTC")
    return RateLimited(
        f"GitHub's rate limit asks for a {wait.wait_s / 60:.0f}-minute wait (until {resets}); "
        f"what was fetched is saved in {state_dir}: run the same command again then to continue",
        retry_after_s=wait.wait_s,
    )


def check_repository(repository: str) -> None:
    if not _REPOSITORY.match(repository):
        raise InvalidInput(f"--from-github takes owner/repo, not {repository!r}")


def _load_state(path: Path, repository: str) -> FetchState:
    if not path.exists():
        return FetchState(repository)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        state = FetchState(**data)
    except (OSError, ValueError, TypeError) as error:
        raise InvalidInput(
            f"{path}: not a fetch state ({error}); remove it to start over"
        ) from error
    if state.repository != repository:
        raise InvalidInput(f"{path} is the fetch of {state.repository}, not {repository}")
    return state


def _save_state(path: Path, state: FetchState) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(asdict(state), indent=2), encoding="utf-8")
    os.replace(partial, path)


def _written_numbers(path: Path) -> list[tuple[int, int]]:
    """(number, bytes) of each issue line already in the file; a last line cut short by a
    crash is cut off."""
    if not path.exists():
        return []
    written: list[tuple[int, int]] = []
    with path.open("rb") as source:
        for line in source:
            try:
                issue = orjson.loads(line) if line.endswith(b"\n") else None
            except orjson.JSONDecodeError:
                issue = None
            if not isinstance(issue, dict) or not isinstance(issue.get("number"), int):
                break
            written.append((issue["number"], len(line)))
    good = sum(size for _, size in written)
    if good != path.stat().st_size:
        with path.open("r+b") as source:
            source.truncate(good)
    return written


def github_api_from_environment(*, max_wait_s: float) -> GithubApi:
    """The API client the environment configures (token and URL, see the module's doc)."""
    token = next((os.environ[name] for name in TOKEN_VARIABLES if os.environ.get(name)), None)
    return GithubApi(os.environ.get(API_URL_VARIABLE) or API_URL, token, max_wait_s=max_wait_s)

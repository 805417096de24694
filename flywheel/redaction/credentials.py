"""Detectors for secrets: provider tokens, JWTs, private-key blocks, credentials in URLs and
secret-looking assignments.

The token shapes, the private-key headers, the secret-name keywords, the JWT validity check
and the Shannon entropy measure come from detect-secrets (Yelp), so they follow its upkeep.
Its scanning loop is not used: it runs every plugin over every line with file-type filters,
far too slow for millions of short texts. Here each detector first checks for a literal it
cannot match without (`eyJ`, `PRIVATE KEY`, `://`), and the provider shapes run as one regex.
"""

from __future__ import annotations

import re
import string

from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.high_entropy_strings import (
    Base64HighEntropyString,
    HexHighEntropyString,
)
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.keyword import DENYLIST
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.stripe import StripeDetector

from flywheel.redaction.spans import Span


def _scoped(pattern: re.Pattern[str]) -> str:
    """A detect-secrets pattern as a group that keeps its own case-insensitivity."""
    return f"(?i:{pattern.pattern})" if pattern.flags & re.IGNORECASE else f"(?:{pattern.pattern})"


_PROVIDER_PATTERNS = [
    AWSKeyDetector.denylist[0],  # access key ids: AKIA..., ASIA...
    *GitHubTokenDetector.denylist,  # ghp_, gho_, ghu_, ghs_, ghr_
    *SlackDetector.denylist,  # xox?- tokens and webhook URLs
    *StripeDetector.denylist,  # sk_live_, rk_live_
    *OpenAIDetector.denylist,  # sk-...T3BlbkFJ...
    GitLabTokenDetector.denylist[0],  # glpat-, gldt-, ...
    *SendGridDetector.denylist,  # SG.xxx.yyy
    *PypiTokenDetector.denylist,  # pypi-AgEIcHlwaS5vcmc...
    # Shapes detect-secrets 1.5 does not know: fine-grained GitHub tokens, Stripe test keys,
    # OpenAI project/service keys without the legacy marker, Anthropic keys.
    re.compile(r"github_pat_[A-Za-z0-9_]{22,}"),
    re.compile(r"(?:r|s)k_test_[0-9a-zA-Z]{24}"),
    re.compile(r"sk-(?:proj|svcacct|admin|ant-api\d\d)-[A-Za-z0-9_\-]{20,}"),  # OpenAI, Anthropic
]
_PROVIDER = re.compile(
    r"(?<![A-Za-z0-9])(?:" + "|".join(_scoped(p) for p in _PROVIDER_PATTERNS) + r")[\w\-]*"
)
# A literal each provider shape holds, as one pattern whose branches all start with a literal
# (the regex engine then skips to those characters): far cheaper than the shapes themselves.
_PROVIDER_HINT = re.compile(
    r"A(?:KIA|SIA|BIA|CCA|3T)|g(?:h[pousr]_|ithub_pat_|l(?:pat|dt|ft|soat|rt)-)|k(?:_live_|_test_|-)"
    r"|xox|XOX|T3BlbkFJ|SG\.|pypi-AgE|hooks\.slack"
)
_AWS_QUOTED_SECRET = AWSKeyDetector.denylist[1]  # aws...key = "<40 base64 chars>"

_JWT = re.compile(r"eyJ[A-Za-z0-9_\-]{8,}={0,2}\.[A-Za-z0-9_\-]{4,}={0,2}\.[A-Za-z0-9_\-+/]*={0,2}")

_KEY_HEADERS = [p.pattern for p in PrivateKeyDetector.denylist if p.pattern.startswith("BEGIN")]
_PRIVATE_KEY = re.compile(
    r"-{4,5} ?(?:" + "|".join([*_KEY_HEADERS, "BEGIN ENCRYPTED PRIVATE KEY"]) + r") ?-{4,5}"
    r"[\s\S]*?(?:-{4,5} ?END [A-Z0-9 ]*?PRIVATE KEY(?: BLOCK)? ?-{4,5}|\Z)"
    r"|PuTTY-User-Key-File-\d:[\s\S]*?(?:Private-MAC: *[0-9a-fA-F]+|\Z)"
)

# `scheme://user:password@host` (or a token alone as userinfo): only the userinfo is replaced.
# Starting at the `://` literal lets the regex engine skip straight to candidates.
_URL_USERINFO = re.compile(
    r"://(?:(?P<user>[^\s/?#@:]*):(?P<password>[^\s/?#@]+)|(?P<token>[A-Za-z0-9_\-]{16,}))@"
)

# Secret-looking names: detect-secrets' keyword list, plus tokens, credentials and `*_key`.
# They are found with `str.find` on the lower-cased text (one C loop per stem, where a
# case-insensitive alternation would try every position), then checked with these patterns.
_STRONG_WORDS = ["token", "access_?key", "signing_?key", "credential", "passphrase"]
_NAME_STEMS = ("pass", "pwd", "secret", "key", "token", "credential", "contrase")
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")
_NAME_TAIL = re.compile(r"[A-Za-z0-9_.\-]*")
_NAME_MAX = 64
# After the name, on the same line: an optional closing quote/bracket, `=`, `:`, `:=`, `=>`,
# `==` or ` is `, then a quoted or a bare value. Flags (`--password x`) are not covered.
_ASSIGNMENT = re.compile(
    r"[\"'\]]{0,2}[ \t]*(?P<operator>:=|=>|==|!=|[:=]|[ \t]+is[ \t]+)[ \t]*"
    r"(?:(?P<quote>[\"'`])(?P<quoted>[^\"'`\n]{1,300})(?P=quote)"
    r"|(?P<bare>[^\s\"'`,;&()\[\]{}<>]{1,300})(?=[\s\"'`,;&)\]}]|$))"
)
_COMPARISONS = frozenset({"==", "!="})
_BEARER = re.compile(r"[Bb](?:earer|asic)\s+([A-Za-z0-9\-._~+/]{15,}[A-Za-z0-9\-_~+/]=*)")

_PASSWORD_NAME = re.compile(
    r"(?i:password|passwd|passphrase|pwd|(?:db|database|key)_?pass(?![a-z])|contrase)"
)
_STRONG_NAME = re.compile("(?i:" + "|".join([*DENYLIST, *_STRONG_WORDS]) + ")")
_COUNTING_NAME = re.compile(r"(?i:tokeni[sz]|tokens\b|token_?(?:count|limit|type|len|ids?|usage))")
# A name ending in a `key` word (`stripe_key`, `stripeKey`, `STRIPE-KEY`), but not `monkey`.
_WEAK_NAME = re.compile(r"[\w.\-]*(?:[_.\-](?:key|Key|KEY)|[a-z0-9]Key)")
_TOKEN_VALUE = re.compile(r"[A-Za-z0-9+/=_\-.~]+")
_HEX = re.compile(r"[0-9a-fA-F]+")
_UUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")
_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
# Values that are code or stand-ins, never a real secret (`postgres://user:pass@host` in docs).
_NOT_VALUES = frozenset(
    {
        *("none", "null", "nil", "true", "false", "undefined", "required", "optional"),
        *("str", "bytes", "string", "int", "secretstr"),
        *("redacted", "changeme", "hidden", "masked", "example", "xxx"),
        *("pass", "password", "passwd", "pwd", "secret"),
    }
)
_PLACEHOLDER_STARTS = ("$", "{", "<", "%(", "*", "os.", "process.env")
_PATH = re.compile(r"(?:~|\.{1,2})?(?:/[\w.\-]+)+/?")
_BASE64_ENTROPY = Base64HighEntropyString().calculate_shannon_entropy
_HEX_ENTROPY = HexHighEntropyString().calculate_shannon_entropy


def find_secrets(text: str, lowered: str) -> list[Span]:
    """Every secret in `text`; `lowered` is `text.lower()` (same length), shared with the
    other detectors."""
    found: list[Span] = []
    if _PROVIDER_HINT.search(text) is not None:
        found += [Span(m.start(), m.end(), "SECRET") for m in _PROVIDER.finditer(text)]
    if "eyJ" in text:
        found += _jwts(text)
    if "PRIVATE KEY" in text or "PuTTY-User-Key-File" in text:
        found += [Span(m.start(), m.end(), "SECRET") for m in _PRIVATE_KEY.finditer(text)]
    if "://" in text and "@" in text:
        found += _url_credentials(text)
    if "aws" in lowered:
        found += _aws_quoted_secrets(text, lowered)
    if "earer" in lowered or "basic" in lowered:
        found += _bearer_tokens(text)
    for stem in _NAME_STEMS:
        if stem in lowered:
            found += _assignments(text, lowered, stem)
    return found


def _jwts(text: str) -> list[Span]:
    spans = []
    for match in _JWT.finditer(text):
        token = match.group()
        if JwtTokenDetector.is_formally_valid(token):
            spans.append(Span(match.start(), match.end(), "SECRET"))
    return spans


def _url_credentials(text: str) -> list[Span]:
    spans = []
    for match in _URL_USERINFO.finditer(text):
        if match.group("token") is not None:
            if _looks_like_key(match.group("token")):
                spans.append(Span(match.start("token"), match.end("token"), "SECRET"))
        elif not _is_reference(match.group("password"), is_quoted=True):
            spans.append(Span(match.start("user"), match.end("password"), "SECRET"))
    return spans


def _bearer_tokens(text: str) -> list[Span]:
    return [
        Span(match.start(1), match.end(1), "SECRET")
        for match in _BEARER.finditer(text)
        if _looks_like_key(match.group(1))
    ]


def _aws_quoted_secrets(text: str, lowered: str) -> list[Span]:
    found = []
    at = lowered.find("aws")
    while at >= 0:
        match = _AWS_QUOTED_SECRET.match(text, at)
        if match is not None:
            found.append(Span(match.start(1), match.end(1), "SECRET"))
        at = lowered.find("aws", at + 3)
    return found


def _assignments(text: str, lowered: str, stem: str) -> list[Span]:
    """`NAME = value` where NAME holds `stem` and looks secret, and the value looks like a
    secret: the span of the value only."""
    found = []
    at = lowered.find(stem)
    while at >= 0:
        start, end = _word_around(text, at, at + len(stem))
        value = _assigned_value(text, end)
        if value is not None:
            value_start, value_end, is_quoted = value
            if is_secret_value(text[start:end], text[value_start:value_end], is_quoted=is_quoted):
                found.append(Span(value_start, value_end, "SECRET"))
        at = lowered.find(stem, end)
    return found


def _assigned_value(text: str, name_end: int) -> tuple[int, int, bool] | None:
    """Where the literal assigned to the name ending at `name_end` sits, and whether it is
    quoted. A bare value after `==` or `!=` (`password == confirm`) is a variable."""
    assigned = _ASSIGNMENT.match(text, name_end)
    if assigned is None:
        return None
    if assigned.group("quoted") is not None:
        return (*assigned.span("quoted"), True)
    if assigned.group("operator") in _COMPARISONS:
        return None
    return (*assigned.span("bare"), False)


def _word_around(text: str, start: int, end: int) -> tuple[int, int]:
    """The identifier (`db.PASSWORD_2`, `api-key`) that holds `text[start:end]`. In prose the
    stem is a word of its own, so the left scan usually stops at once."""
    limit = max(0, start - _NAME_MAX)
    while start > limit and text[start - 1] in _NAME_CHARS:
        start -= 1
    tail = _NAME_TAIL.match(text, end, end + _NAME_MAX)
    return start, tail.end() if tail is not None else end


def is_secret_value(name: str, value: str, *, is_quoted: bool = False) -> bool:
    """Whether `value`, assigned to `name`, is a secret. Passwords need only look like one;
    keys and tokens must be long and random; values of a plain `*_key` (a Stripe key, or a
    cache key) must also be 20+ characters and neither hex nor a UUID, which are how ids and
    digests look."""
    if _is_reference(value, is_quoted=is_quoted) or _COUNTING_NAME.search(name):
        return False
    if _PASSWORD_NAME.search(name):
        return _looks_like_password(value, is_literal=is_quoted or name.isupper())
    if _STRONG_NAME.search(name):
        return _looks_like_key(value, is_quoted=is_quoted)
    if _WEAK_NAME.fullmatch(name):
        plain_id = _HEX.fullmatch(value) or _UUID.fullmatch(value)
        return len(value) >= 20 and not plain_id and _looks_like_key(value, is_quoted=is_quoted)
    return False


def _is_reference(value: str, *, is_quoted: bool) -> bool:
    """Templates, paths and code, not values: `${DB_PASSWORD}`, `{password}`, `<your key>`,
    `***`, `None`, `/run/secrets/db`; unquoted also `settings.api_key`, `getpass()`."""
    if value.startswith(_PLACEHOLDER_STARTS) or value.lower() in _NOT_VALUES:
        return True
    if _PATH.fullmatch(value) is not None:
        return True
    return not is_quoted and ("(" in value or _DOTTED_NAME.fullmatch(value) is not None)


def _looks_like_password(value: str, *, is_literal: bool) -> bool:
    """6+ characters, 4+ distinct, no spaces. A bare identifier in code (`password = pw`,
    `password: SecretStr`) is a variable or a type unless it holds a digit (`hunter2`); in a
    quoted string or an upper-case env/config name (`PGPASSWORD=...`) it is a literal."""
    if len(value) < 6 or len(set(value)) < 4 or any(char.isspace() for char in value):
        return False
    if not is_literal and _IDENTIFIER.fullmatch(value):
        return "_" not in value and any(char.isdigit() for char in value)
    return True


def _looks_like_key(value: str, *, is_quoted: bool = False) -> bool:
    """Random enough to be a key: 16+ characters (token characters unless quoted), letters
    and digits, and entropy above detect-secrets' hex limit (3.0) or its base64 measure above
    3.3 (16 random base62 characters score about 3.7; words joined by dashes rarely pass 3.3)."""
    if len(value) < 16 or any(char.isspace() for char in value):
        return False
    if not is_quoted and _TOKEN_VALUE.fullmatch(value) is None:
        return False
    if not any(char.isdigit() for char in value) or not any(char.isalpha() for char in value):
        return False
    if _HEX.fullmatch(value):
        return bool(_HEX_ENTROPY(value) > 3.0)
    return bool(_BASE64_ENTROPY(value) > 3.3)

"""A planted corpus for measuring `flywheel.redaction`: support tickets and chat messages with
known PII and secrets at known offsets, and code/config that must come through byte for byte.

Deterministic: the same seed builds the same corpus, so a recall change is the engine's, never
the data's. Every planted value is synthetic (valid checksums, reserved-looking names); the
hard negatives mixed into the prose (versions, dates, order numbers, hashes, `python@2.7`) are
there to be left alone. `score` counts, per type, planted spans covered by a redaction of the
same type (recall) and redactions overlapping a planted span of the same type (precision);
any redaction in a code snippet is a false positive.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import string
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flywheel.redaction import KINDS, Redaction
from flywheel.redaction.checksums import iban_check_digits, luhn_complete

SEED = 20261130
ITEMS_PER_KIND = 80

Part = str | tuple[str, str]  # literal text, or (kind, planted value)


@dataclass(frozen=True)
class Planted:
    start: int
    end: int
    kind: str


@dataclass(frozen=True)
class Sample:
    text: str
    names: tuple[str, ...] = ()
    planted: tuple[Planted, ...] = ()


@dataclass
class KindScore:
    planted: int = 0
    covered: int = 0
    redactions: int = 0
    correct: int = 0
    misses: list[str] = field(default_factory=list)
    false_positives: list[str] = field(default_factory=list)

    @property
    def recall(self) -> float:
        return self.covered / self.planted if self.planted else 1.0

    @property
    def precision(self) -> float:
        return self.correct / self.redactions if self.redactions else 1.0


FIRST_NAMES = [
    "Jane", "Priya", "Mateo", "Zoë", "José", "Łukasz", "Aoife", "Søren", "Chidi", "Mei",
    "Olamide", "Dmitri", "Ingrid", "Kenji", "Fatima", "Ann", "Tomasz", "Aurélie", "Björn",
    "Thandiwe", "Siobhan", "Rafael", "Yusuf", "Marguerite",
]  # fmt: skip
LAST_NAMES = [
    "Doe", "Okafor", "Müller", "García", "Wójcik", "Kowalski", "Haddad", "Lindqvist", "Tanaka",
    "Fernández", "Nakamura", "Petrov", "Dubois", "Øverland", "Nguyen", "Achebe", "O'Connell",
    "Castellanos", "Rasmussen", "Abernathy",
]  # fmt: skip
CJK_NAMES = ["王芳", "李雷", "山田太郎", "陈静"]
COMPANIES = ["acme", "globex", "initech", "umbrella-corp", "hooli", "vandelay"]
TLDS = ["com", "io", "co.uk", "de", "org", "example"]

# Prose around planted items; `{}` is where the item goes. Hard negatives are mixed in.
TICKET_LINES = [
    "Hi team, after upgrading to version 2.4.1 on 2024-03-15 the export fails. Contact: {}.",
    "Order #48213 was charged twice ($1,299.00). Reach me at {} if you need more detail.",
    "The nightly job (build 1700000000000) stopped at 14:30 UTC; details below: {}",
    "We pinned numpy==1.26.4 and python@2.7 still runs the legacy tool. Reference {} please.",
    "Per JIRA-4821, the customer asked us to update the record with {} before Friday.",
    "Ticket escalated: the annual report (Annual plan, 12 seats) lists {} as the contact.",
    "Logs attached, commit 9fceb02d0ae598e95dc970b74767f19372d61af8; the value was {}.",
    "Support note: v2.3.1-rc1 on 127.0.0.1:8080 reproduces it; customer gave {} over chat.",
    "The key takeaway: tokens expire after 3600 s. Customer data: {}.",
    "Please do not reset the password again. Their details are {} (verified by phone).",
]
CHAT_LINES = [
    "user: hey, can you update my profile? it's {} now",
    "assistant: Sure. I have noted {} on the account; anything else?",
    "user: ok so the config has {} — is that why it breaks on 0.0.0.0:5432?",
    "user: my manager said to send you {}. we're on plan 3 of 5, sorry for the mess",
    "agent: Thanks! Logged {} against case 2024-0042 (sha256 in the attachment).",
]
CJK_LINES = ["感谢{}的帮助\uff0c问题已在 2.4.1 版本解决。", "请联系{}处理订单 48213。"]


def build_corpus(seed: int = SEED, items_per_kind: int = ITEMS_PER_KIND) -> list[Sample]:
    """Samples of 3-5 planted items each, every kind equally often, shuffled together."""
    rng = random.Random(seed)
    queue = [kind for kind in KINDS for _ in range(items_per_kind)]
    rng.shuffle(queue)
    samples = []
    while queue:
        take = queue[: rng.randint(3, 5)]
        queue = queue[len(take) :]
        samples.append(_sample(rng, take))
    return samples


def _sample(rng: random.Random, kinds: Sequence[str]) -> Sample:
    people = [_person(rng) for _ in range(3)]
    lines = CHAT_LINES if rng.random() < 0.4 else TICKET_LINES
    parts: list[Part] = []
    for kind in kinds:
        if kind == "NAME" and rng.random() < 0.15:
            cjk = rng.choice(CJK_NAMES)
            people.append(cjk)
            before, after = rng.choice(CJK_LINES).split("{}")
            parts += [before, ("NAME", cjk), after, "\n"]
            continue
        before, after = rng.choice(lines).split("{}")
        item = _name_mention(rng, people[:3]) if kind == "NAME" else GENERATORS[kind](rng)
        parts += [before, *item, after, "\n"]
    return _assemble(parts, tuple(people))


def _assemble(parts: Sequence[Part], names: tuple[str, ...]) -> Sample:
    text, planted = "", []
    for part in parts:
        if isinstance(part, str):
            text += part
        else:
            kind, value = part
            planted.append(Planted(len(text), len(text) + len(value), kind))
            text += value
    return Sample(text, names, tuple(planted))


def _person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"


def _name_mention(rng: random.Random, people: list[str]) -> list[Part]:
    person = rng.choice(people)
    first, last = person.split(" ")
    mention = rng.choice([person, first, last, person, person.upper()])
    before, after = rng.choice(
        [("", ""), ("Dr. ", ""), ("", "'s"), ("@", ""), ("— ", ","), ("cc ", ";")]
    )
    return [before, ("NAME", mention), after]


def _email(rng: random.Random) -> list[Part]:
    first = rng.choice(FIRST_NAMES).lower()
    last = rng.choice(LAST_NAMES).lower().replace("'", "")
    local = rng.choice(
        [
            f"{first}.{last}",
            f"{first[0]}{last}{rng.randint(1, 99)}",
            f"{first}+billing",
            f"{first}_{last}",
        ]
    )
    domain = f"{rng.choice(['', 'mail.', 'eu.'])}{rng.choice(COMPANIES)}.{rng.choice(TLDS)}"
    address = f"{local}@{domain}"
    if rng.random() < 0.15:
        address = address.title()
    before, after = rng.choice(
        [("", ""), ("<", ">"), ("mailto:", ""), ("(", ")"), ("email=", "&x=1")]
    )
    return [before, ("EMAIL", address), after]


def _phone(rng: random.Random) -> list[Part]:
    area, exchange, line = rng.randint(201, 989), rng.randint(200, 999), rng.randint(0, 9999)
    nanp = [
        f"({area}) {exchange}-{line:04d}", f"{area}-{exchange}-{line:04d}",
        f"({area}){exchange}-{line:04d}", f"{area} {exchange} {line:04d}",
        f"+1 ({area}) {exchange}-{line:04d}",
        f"{area}.{exchange}.{line:04d}", f"+1 {area} {exchange} {line:04d}",
        f"+1-{area}-{exchange}-{line:04d}", f"1-800-{exchange}-{line:04d}",
    ]  # fmt: skip
    digits = "".join(rng.choice(string.digits) for _ in range(10))
    world = [
        f"+44 20 {digits[:4]} {digits[4:8]}", f"+49 30 {digits[:8]}",
        f"+33 1 {digits[:2]} {digits[2:4]} {digits[4:6]} {digits[6:8]}",
        f"+91 9{digits[:4]} {digits[4:9]}", f"+61 2 {digits[:4]} {digits[4:8]}",
        f"+81 3-{digits[:4]}-{digits[4:8]}", f"+55 11 9{digits[:4]}-{digits[4:8]}",
        f"+353 1 {digits[:3]} {digits[3:7]}", f"+44 (0)20 {digits[:4]} {digits[4:8]}",
        f"+86 138 {digits[:4]} {digits[4:8]}", f"+7 495 {digits[:3]}-{digits[3:5]}-{digits[5:7]}",
    ]  # fmt: skip
    before, after = rng.choice(
        [("", ""), ("tel:", ""), ("", " ext. 204"), ("phone: ", ","), ("(cell ", ")")]
    )
    return [before, ("PHONE", rng.choice(nanp + world)), after]


CARD_PREFIXES = [("4", 16), ("4", 13), ("51", 16), ("55", 16), ("2221", 16), ("34", 15),
                 ("37", 15), ("6011", 16), ("3530", 16), ("62", 16), ("4", 19)]  # fmt: skip


def _card(rng: random.Random) -> list[Part]:
    prefix, length = rng.choice(CARD_PREFIXES)
    body = prefix + "".join(rng.choice(string.digits) for _ in range(length - len(prefix) - 1))
    number = luhn_complete(body)
    style = rng.choice(["space", "dash", "plain"]) if length in (15, 16) else "plain"
    if style != "plain":
        sep = " " if style == "space" else "-"
        groups = (4, 6, 5) if length == 15 else (4, 4, 4, 4)
        cuts, at = [], 0
        for size in groups:
            cuts.append(number[at : at + size])
            at += size
        number = sep.join(cuts)
    before, after = rng.choice(
        [("", ""), ("card ", ","), ("cc: ", ";"), ("Visa/MC ", " exp 09/27")]
    )
    return [before, ("CARD", number), after]


# Country, then the BBAN as runs of (count, alphabet): n digits, a upper-case letters, c both.
IBAN_FORMATS = {
    "DE": "18n", "GB": "4a14n", "FR": "10n11c2n", "ES": "20n", "IT": "1a10n12c", "NL": "4a10n",
    "BE": "12n", "CH": "5n12c", "PL": "24n", "SE": "20n", "AT": "16n", "IE": "4a14n",
}  # fmt: skip
_ALPHABETS = {
    "n": string.digits,
    "a": string.ascii_uppercase,
    "c": string.ascii_uppercase + string.digits,
}


def _iban(rng: random.Random) -> list[Part]:
    country = rng.choice(sorted(IBAN_FORMATS))
    bban, count = "", ""
    for char in IBAN_FORMATS[country]:
        if char.isdigit():
            count += char
            continue
        bban += "".join(rng.choice(_ALPHABETS[char]) for _ in range(int(count)))
        count = ""
    iban = country + iban_check_digits(country, bban) + bban
    if rng.random() < 0.6:
        iban = " ".join(iban[at : at + 4] for at in range(0, len(iban), 4))
    before, after = rng.choice(
        [("", ""), ("IBAN: ", ""), ("IBAN ", " BIC COBADEFFXXX"), ("to ", ".")]
    )
    return [before, ("IBAN", iban), after]


def _ssn(rng: random.Random) -> list[Part]:
    area = rng.choice([*range(1, 666), *range(667, 900)])
    number = f"{area:03d}-{rng.randint(1, 99):02d}-{rng.randint(1, 9999):04d}"
    if rng.random() < 0.25:
        label = rng.choice(["SSN ", "SSN#", "social security number ", "Social Security no. "])
        return [label, ("SSN", number.replace("-", rng.choice(["", " "])))]
    return [rng.choice(["", "SSN: ", "ssn "]), ("SSN", number)]


def _ip(rng: random.Random) -> list[Part]:
    octets = [rng.randint(1, 223), rng.randint(0, 255), rng.randint(0, 255), rng.randint(1, 254)]
    if octets[0] == 127:
        octets[0] = 128
    v6_groups = [
        f"{rng.randint(0x2000, 0x3FFF):x}",
        *(f"{rng.randint(0, 0xFFFF):x}" for _ in range(7)),
    ]
    shapes: list[list[Part]] = [
        [("IP", ".".join(map(str, octets)))],
        [("IP", f"10.{octets[1]}.{octets[2]}.{octets[3]}"), f":{rng.randint(1024, 65535)}"],
        [("IP", f"192.168.{octets[2]}.0"), "/24"],
        ["IP=", ("IP", f"172.{rng.randint(16, 31)}.{octets[2]}.{octets[3]}")],
        [("IP", f"2001:db8:{octets[1]:x}::{octets[2]:x}:{octets[3]:04x}")],
        ["[", ("IP", f"fe80::{octets[1]:x}ff:fe{octets[2]:02x}:{octets[3]:04x}"), "]:443"],
        [("IP", ":".join(v6_groups))],
    ]
    return rng.choice(shapes)


def _random(
    rng: random.Random, length: int, alphabet: str = string.ascii_letters + string.digits
) -> str:
    return "".join(rng.choice(alphabet) for _ in range(length))


def _b64url(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def _jwt(rng: random.Random) -> str:
    header = _b64url({"alg": "HS256", "typ": "JWT"})
    payload = _b64url({"sub": str(rng.randint(10**6, 10**9)), "name": "x", "iat": 1516239022})
    return f"{header}.{payload}.{_random(rng, 43, string.ascii_letters + string.digits + '-_')}"


def _private_key(rng: random.Random) -> str:
    label = rng.choice(["RSA PRIVATE KEY", "OPENSSH PRIVATE KEY", "PRIVATE KEY", "EC PRIVATE KEY"])
    body = "\n".join(
        _random(rng, 64, string.ascii_letters + string.digits + "+/") for _ in range(4)
    )
    return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----"


ALNUM = string.ascii_letters + string.digits
BASE64 = ALNUM + "/+"
URL_SAFE = ALNUM + "-_"


def _secret(rng: random.Random) -> list[Part]:
    team, bot = _random(rng, 8).upper(), _random(rng, 8).upper()
    slack_hook = f"https://hooks.slack.com/services/T{team}/B{bot}/{_random(rng, 24)}"
    slack_bot = (
        f"xoxb-{rng.randint(10**11, 10**12)}-{rng.randint(10**12, 10**13)}-{_random(rng, 24)}"
    )
    weak_password = f"{rng.choice(['Winter', 'hunter', 'Tr0ub4dor'])}{rng.randint(10, 9999)}!"
    basic = base64.b64encode(f"svc:{_random(rng, 12)}".encode()).decode()
    shapes: list[list[Part]] = [
        [("SECRET", "AKIA" + _random(rng, 16, string.ascii_uppercase + string.digits))],
        ["aws_secret_access_key = ", ("SECRET", _random(rng, 40, BASE64))],
        [("SECRET", "ghp_" + _random(rng, 36))],
        [("SECRET", "github_pat_" + _random(rng, 22) + "_" + _random(rng, 59))],
        [("SECRET", slack_bot)],
        [("SECRET", slack_hook)],
        [("SECRET", "sk_live_" + _random(rng, 24))],
        ["Authorization: Bearer ", ("SECRET", _jwt(rng))],
        ["token ", ("SECRET", _jwt(rng))],
        ["\n", ("SECRET", _private_key(rng)), "\n"],
        ["postgres://", ("SECRET", f"admin:{_random(rng, 12)}"), "@db.internal:5432/app"],
        ["DB_PASSWORD=", ("SECRET", weak_password)],
        ['"password": "', ("SECRET", _random(rng, 14) + "#1"), '"'],
        ["my password is ", ("SECRET", f"Summer{rng.randint(2019, 2026)}")],
        ["OPENAI_API_KEY=", ("SECRET", _random(rng, 32))],
        ['{"client_secret": "', ("SECRET", _random(rng, 40)), '"}'],
        ["export GITHUB_TOKEN=", ("SECRET", "ghp_" + _random(rng, 36))],
        ['stripe.api_key = "', ("SECRET", "sk_live_" + _random(rng, 24)), '"'],
        ['"apiKey": "', ("SECRET", _random(rng, 39, URL_SAFE)), '"'],
        ["https://app.example.com/login?password=", ("SECRET", f"Secr3t{rng.randint(10, 99)}!")],
        ["PGPASSWORD=", ("SECRET", _random(rng, 16)), " psql -h db"],
        ["AWS_SESSION_TOKEN=", ("SECRET", _random(rng, 120, BASE64))],
        ["Authorization: Basic ", ("SECRET", basic)],
        ["mysql://", ("SECRET", f"root:{_random(rng, 10)}"), "@db-primary.internal/orders"],
        ["SENDGRID_API_KEY=", ("SECRET", f"SG.{_random(rng, 22)}.{_random(rng, 43)}")],
        ["Authorization: Bearer ", ("SECRET", _random(rng, 40, URL_SAFE))],
    ]
    return rng.choice(shapes)


GENERATORS: dict[str, Callable[[random.Random], list[Part]]] = {
    "EMAIL": _email, "PHONE": _phone, "CARD": _card, "IBAN": _iban, "SSN": _ssn, "IP": _ip,
    "SECRET": _secret,
}  # fmt: skip


def code_snippets(seed: int = SEED) -> list[str]:
    """Code and config that hold no PII or secret by the documented rules: they must come
    through `redact` unchanged."""
    rng = random.Random(seed)
    sha1 = hashlib.sha1(rng.randbytes(16)).hexdigest()
    sha256 = hashlib.sha256(rng.randbytes(16)).hexdigest()
    ident = uuid.UUID(int=rng.getrandbits(128), version=4)
    return [
        "pip install numpy==1.26.4 pandas>=2.2.0 'torch<2.15'\nbrew install python@2.7 python@3.11",
        "npm install lodash@4.17.21 @types/node@20.11.5 && docker pull postgres:16.2",
        "release: v2.3.1-rc1 (build 2024.03.15.1) tagged at commit " + sha1,
        f"sha256:{sha256}  flywheel-0.1.0-py3-none-any.whl\nmd5 {sha256[:32]}",
        f"request_id = '{ident}'\nidempotency_key = \"{ident}\"\ncache_key = f'user:{{user_id}}'",
        "def check_password(password: str, user_id: int) -> bool:\n"
        "    return verify(password, load_hash(user_id))",
        'password = os.environ["DB_PASSWORD"]\napi_key = settings.api_key\n'
        'token = request.headers.get("Authorization")',
        "DATABASE_URL: postgresql+psycopg://postgres@127.0.0.1:5432/flywheel\n"
        "DB_PASSWORD: ${DB_PASSWORD}",
        'url = f"postgresql://{user}:{password}@{host}:{port}/{db}"',
        "HOST = '0.0.0.0'\nPORT = 8080\nNETMASK = '255.255.255.0'\nBROADCAST = '255.255.255.255'",
        "server {\n    listen 127.0.0.1:8443 ssl;\n    proxy_pass http://localhost:3000;\n}",
        "max_tokens = 4096\ntokenizer = 'bert-base-uncased'\n"
        "num_tokens: 128000\ntoken_type = 'bearer'",
        "class AWSRegion(str, Enum):\n    US_EAST_1 = 'us-east-1'\n    EU_WEST_1 = 'eu-west-1'",
        "for user_id, email_field in rows:\n    if email_field.endswith('@'):\n        continue",
        "@app.route('/users/<int:user_id>')\n@pytest.fixture\ndef handler(a, b):\n    return a @ b",
        "x = values[1::2]\nlogger.info('started at 12:30:45 on 2024-03-15T12:30:45Z')",
        "git clone git@github.com:acme/flywheel.git && cd flywheel && git checkout " + sha1[:12],
        "/usr/local/lib/python3.11/site-packages/numpy/core/_methods.py:49: RuntimeWarning",
        "timestamp_ms = 1700000000000\ncount = 4111\nratio = 0.8451\nprice = 1299.00",
        "mac = '00:1A:2B:3C:4D:5E'\nversion = '1.2.3'\nsemver = '10.4.2-beta.1'",
        "SECRET_KEY = os.getenv('SECRET_KEY')\nPASSWORD_MIN_LENGTH = 12\n"
        "password_hash = hasher(pw)",
        "password: Optional[SecretStr] = None\napi_key: str = Field(..., min_length=16)",
        "std::vector<int> v; std::map<int, int> m; auto x = a::b::c;",
        "SELECT id, email, phone FROM users WHERE created_at > '2024-01-01' LIMIT 500;",
        "CHANGELOG\n- 2.4.1 (2024-03-15): fix export timeout (#4821)\n"
        "- 2.4.0 (2024-02-01): add SSO",
        "docker run -p 127.0.0.1:5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:16",
        "ip_address = request.client.host\nuser_email = user.email\nphone_number = form['phone']",
        f"checksum = '{sha256}'\ncommit_sha = \"{sha1}\"",
        "keyboard_layout = 'us'\nmonkey_patch = True\n"
        "primary_key = 'id'\nsort_key = lambda r: r.id",
        "jobs:\n  test:\n    runs-on: ubuntu-22.04\n    steps:\n      - uses: actions/checkout@v4",
        "Traceback (most recent call last):\n"
        '  File "app.py", line 42, in <module>\n'
        "KeyError: 'user_id'",
        "export PATH=/usr/local/bin:$PATH\nexport PWD=/home/app\ncd ~/projects/flywheel",
        "if password == confirm_password:\n    save(user_id, password)\nsecret = None",
        "curl -s http://localhost:8000/healthz && curl http://[::1]:8000/readyz",
        "matrix = [[1, 2], [3, 4]]\nphone = None\nssn_field = 'ssn'\niban_field = 'iban'",
        "EMAIL_BACKEND = 'django.core.mail.backends.smtp.EmailBackend'\nEMAIL_PORT = 587",
        "RUN pip install --no-cache-dir -r requirements.txt\n"
        'EXPOSE 8080\nCMD ["python", "-m", "app"]',
        "api_version: '2024-06-01'\nmodel: gpt-4o-mini-2024-07-18\ntemperature: 0.2",
        "for i in range(1, 10_000):\n    total += i * 3.14159\nprint(f'{total:,.2f}')",
        "ISBN 978-3-16-148410-0; DOI 10.1000/182; order 2024-0042-7781",
    ]


def score(
    samples: Sequence[Sample],
    snippets: Sequence[str],
    redact: Callable[[str, Sequence[str]], Redaction],
) -> dict[str, KindScore]:
    """Per-type recall and precision of `redact` on the planted samples and the code."""
    scores = {kind: KindScore() for kind in KINDS}
    for sample in samples:
        spans = redact(sample.text, sample.names).spans
        for planted in sample.planted:
            kind_score = scores[planted.kind]
            kind_score.planted += 1
            if any(
                s.kind == planted.kind and s.start <= planted.start and planted.end <= s.end
                for s in spans
            ):
                kind_score.covered += 1
            else:
                kind_score.misses.append(sample.text[planted.start : planted.end])
        for span in spans:
            kind_score = scores[span.kind]
            kind_score.redactions += 1
            if any(
                p.kind == span.kind and p.start < span.end and span.start < p.end
                for p in sample.planted
            ):
                kind_score.correct += 1
            else:
                kind_score.false_positives.append(sample.text[span.start : span.end])
    for snippet in snippets:
        for span in redact(snippet, ()).spans:
            scores[span.kind].redactions += 1
            scores[span.kind].false_positives.append(snippet[span.start : span.end])
    return scores

"""The demo's code domain: a small invoicing library with unit tests, committed to git.

`flywheel ingest repo DIR --domain code --history 2` turns its tested, documented functions
into verifiable tasks (the hidden tests are the repository's own tests of each function) and
its second commit, which adds a function together with its test, into a "make these tests
pass" task. Two functions are there to be turned down: one no test calls, and a method.

The commits are deterministic: fixed author, committer, dates and message, and git's own
configuration shut out (no global or system config), so the same files give the same commit
ids on every machine. Without a `git` executable the files are written as a plain directory,
which `flywheel ingest repo` reads too (without `--history`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

INIT = '''"""Invoicing helpers: money, tax and invoice numbers."""

from invoicing.money import apply_discount, format_money, vat_amount
from invoicing.numbers import invoice_number, parse_invoice_number

__all__ = [
    "apply_discount",
    "format_money",
    "invoice_number",
    "parse_invoice_number",
    "vat_amount",
]
'''

MONEY = '''"""Money amounts in integer cents: no floating-point rounding surprises."""

CURRENCY_SYMBOLS = {"EUR": "€", "USD": "$", "GBP": "£"}


def vat_amount(net_cents, rate_percent):
    """The VAT on a net amount in cents, rounded half up to a whole cent.

    >>> vat_amount(1000, 19)
    190
    """
    if net_cents < 0:
        raise ValueError("the net amount cannot be negative")
    return (net_cents * rate_percent * 2 + 100) // 200


def apply_discount(price_cents, percent):
    """The price after a discount of `percent` (0-100), rounded down to a whole cent."""
    if not 0 <= percent <= 100:
        raise ValueError("a discount is between 0 and 100 percent")
    return price_cents * (100 - percent) // 100


def format_money(cents, currency="EUR"):
    """An amount for people: the currency's symbol, thousands separated, two decimals.

    >>> format_money(123456)
    '€1,234.56'
    """
    symbol = CURRENCY_SYMBOLS.get(currency, currency + " ")
    sign = "-" if cents < 0 else ""
    whole, fraction = divmod(abs(cents), 100)
    return f"{sign}{symbol}{whole:,}.{fraction:02d}"


def to_cents(text):
    return round(float(text) * 100)


class Ledger:
    """A running balance."""

    def __init__(self):
        self.balance_cents = 0

    def post(self, cents):
        """Add an amount to the balance and return the new balance."""
        self.balance_cents += cents
        return self.balance_cents
'''

SPLIT = '''

def split_evenly(total_cents, parts):
    """Split an amount into `parts` instalments that differ by at most one cent, the larger
    ones first, adding up exactly to the total.

    >>> split_evenly(1000, 3)
    [334, 333, 333]
    """
    if parts < 1:
        raise ValueError("at least one instalment")
    share, rest = divmod(total_cents, parts)
    return [share + 1] * rest + [share] * (parts - rest)
'''

NUMBERS = '''"""Invoice numbers: INV-<year>-<five-digit sequence>."""

import re

PATTERN = re.compile(r"INV-(\\d{4})-(\\d{5})")


def invoice_number(year, sequence):
    """The invoice number of the `sequence`-th invoice of `year`.

    >>> invoice_number(2024, 42)
    'INV-2024-00042'
    """
    if not 1 <= sequence <= 99999:
        raise ValueError("the sequence runs from 1 to 99999")
    return f"INV-{year:04d}-{sequence:05d}"


def parse_invoice_number(text):
    """(year, sequence) of an invoice number; ValueError for anything else."""
    match = PATTERN.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not an invoice number: {text!r}")
    return int(match.group(1)), int(match.group(2))


def next_number(previous):
    """The number after `previous`, in the same year."""
    year, sequence = parse_invoice_number(previous)
    return invoice_number(year, sequence + 1)
'''

TEST_MONEY_IMPORTS = """import pytest

from invoicing import apply_discount, format_money, vat_amount
"""

TEST_MONEY = """

def test_vat_on_a_round_amount():
    assert vat_amount(1000, 19) == 190


def test_vat_rounds_half_up():
    assert vat_amount(250, 7) == 18
    assert vat_amount(150, 5) == 8


def test_vat_refuses_negative_amounts():
    with pytest.raises(ValueError):
        vat_amount(-1, 19)


def test_discount():
    assert apply_discount(2000, 15) == 1700
    assert apply_discount(999, 10) == 899
    assert apply_discount(500, 0) == 500


def test_discount_out_of_range():
    with pytest.raises(ValueError):
        apply_discount(1000, 120)


def test_format_money():
    assert format_money(123456) == "€1,234.56"
    assert format_money(5, "USD") == "$0.05"
    assert format_money(-250, "GBP") == "-£2.50"
    assert format_money(100000, "CHF") == "CHF 1,000.00"
"""

TEST_SPLIT_IMPORT = "from invoicing.money import split_evenly\n"

TEST_SPLIT = """

def test_split_evenly():
    assert split_evenly(1000, 3) == [334, 333, 333]
    assert split_evenly(900, 3) == [300, 300, 300]
    assert sum(split_evenly(1001, 4)) == 1001
    with pytest.raises(ValueError):
        split_evenly(100, 0)
"""

TEST_NUMBERS = """import pytest

from invoicing.numbers import invoice_number, next_number, parse_invoice_number


def test_invoice_number():
    assert invoice_number(2024, 42) == "INV-2024-00042"
    assert invoice_number(2025, 99999) == "INV-2025-99999"


def test_invoice_number_sequence_range():
    with pytest.raises(ValueError):
        invoice_number(2024, 0)


def test_parse_invoice_number():
    assert parse_invoice_number("INV-2024-00042") == (2024, 42)
    assert parse_invoice_number(" INV-2023-10000 ") == (2023, 10000)
    with pytest.raises(ValueError):
        parse_invoice_number("INV-24-42")


def test_next_number():
    assert next_number("INV-2024-00041") == "INV-2024-00042"
"""

README = """# invoicing

Small helpers for invoices: VAT, discounts, formatting and invoice numbers. Amounts are
integer cents.

    pytest
"""

FIRST_COMMIT = {
    "README.md": README,
    "invoicing/__init__.py": INIT,
    "invoicing/money.py": MONEY,
    "invoicing/numbers.py": NUMBERS,
    "tests/test_money.py": TEST_MONEY_IMPORTS + TEST_MONEY,
    "tests/test_numbers.py": TEST_NUMBERS,
}
SECOND_COMMIT = {
    "invoicing/money.py": MONEY + SPLIT,
    "tests/test_money.py": TEST_MONEY_IMPORTS + TEST_SPLIT_IMPORT + TEST_MONEY + TEST_SPLIT,
}
MESSAGES = (
    "Invoicing helpers: VAT, discounts, money formatting, invoice numbers",
    "Add split_evenly for instalment plans\n\nInstalments differ by at most one cent and "
    "always add up to the invoice total.",
)
DATES = ("2024-05-06T09:30:00+00:00", "2024-05-13T14:05:00+00:00")
AUTHOR = ("Demo Developer", "dev@invoicing.example")


def write(root: Path) -> Path:
    """The repository at `root` (replaced if it exists): two commits when git is there, the
    final files alone when it is not."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    git = shutil.which("git")
    for files, message, date in zip((FIRST_COMMIT, SECOND_COMMIT), MESSAGES, DATES, strict=True):
        for relative, text in files.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8", newline="\n")
        if git is not None:
            _commit(git, root, message, date)
    return root


def _commit(git: str, root: Path, message: str, date: str) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(root)),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": AUTHOR[0],
        "GIT_AUTHOR_EMAIL": AUTHOR[1],
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": AUTHOR[0],
        "GIT_COMMITTER_EMAIL": AUTHOR[1],
        "GIT_COMMITTER_DATE": date,
        "LC_ALL": "C",
    }
    if not (root / ".git").exists():
        _git(git, root, env, "-c", "init.defaultBranch=main", "init", "--quiet")
    _git(git, root, env, "add", "--all")
    _git(git, root, env, "commit", "--quiet", "--no-gpg-sign", "--message", message)


def _git(git: str, root: Path, env: dict[str, str], *args: str) -> None:
    subprocess.run([git, *args], cwd=root, env=env, check=True, capture_output=True)

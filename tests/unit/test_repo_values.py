"""What a repository function gives back, read from its code: a value, or something that
cannot cross the sandbox (an iterator, a function, an object, an argument changed in place)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ingest.repo.codebase import Codebase
from ingest.repo.files import DirectorySnapshot
from ingest.repo.values import returned

MODULE = """
import datetime as dt
import itertools as it
from collections import Counter
from itertools import chain

def helper_gen(xs):
    yield from xs

def lazy(xs):
    return chain.from_iterable(xs)

class Box:
    pass

class Name(str):
    pass

class Error(ValueError):
    pass

class Tally(Counter):
    pass
"""

CASES = [
    ("return it.islice(xs, 2)", "returns_iterator", "it.islice(...)"),
    ("return chain.from_iterable(xs)", "returns_iterator", "chain.from_iterable(...)"),
    ("return [iter(x) for x in xs]", "returns_iterator", "a list holding iter(...)"),
    ("return helper_gen(xs)", "returns_iterator", "helper_gen(...) (a generator)"),
    ("return lazy(xs)", "returns_iterator", "lazy(...) (chain.from_iterable(...))"),
    ("return lambda: xs", "returns_function", "a function"),
    ("def inner():\n    return 1\nreturn inner", "returns_function", "inner (a function)"),
    ("return Box()", "returns_object", "a Box object"),
    ("return dt.timedelta(days=1)", "returns_object", "a timedelta object"),
    ("return Error()", "returns_object", "an Error object"),
    ("found = []\nfound.append(Box())\nreturn found", "returns_object",
     "found (a collection holding a Box object)"),
    ("xs.append(1)\nreturn len(xs)", "mutates_argument", "xs"),
    ("xs[0] = 1\nreturn xs", "mutates_argument", "xs"),
    ("yield xs", "generator", "a generator"),
]  # fmt: skip
VALUES = [
    "return list(it.islice(xs, 2))",
    "return sorted(xs)",
    "return Name('x')",  # a str subclass: it crosses as a str
    "return Counter(xs)",  # a dict subclass: it crosses as a dict
    "return Tally(xs)",
    "return frozenset(xs)",
    "xs = list(xs)\nxs.append(1)\nreturn xs",  # a copy of its own
    "kwargs.setdefault('a', 1)\nreturn kwargs",  # **kwargs is the function's own
    "map = dict\nreturn map(a=1)",  # a local name, not the builtin
    "return tuple(map(str, xs))",
]


def codebase_with(tmp_path: Path, body: str) -> Codebase:
    function = "def target(xs, **kwargs):\n" + textwrap.indent(body, "    ") + "\n"
    (tmp_path / "mod.py").write_text(MODULE + "\n" + function)
    return Codebase(DirectorySnapshot(tmp_path))


@pytest.mark.parametrize(("body", "reason", "what"), CASES)
def test_what_cannot_cross_is_named(tmp_path: Path, body: str, reason: str, what: str) -> None:
    found = returned(codebase_with(tmp_path, body), "mod", "target")

    assert found is not None
    assert (found.reason, found.what) == (reason, what)


@pytest.mark.parametrize("body", VALUES)
def test_values_cross(tmp_path: Path, body: str) -> None:
    assert returned(codebase_with(tmp_path, body), "mod", "target") is None


def test_the_detail_says_why(tmp_path: Path) -> None:
    found = returned(codebase_with(tmp_path, "xs.sort()\nreturn 0"), "mod", "target")

    assert found is not None
    assert found.detail("target") == (
        "target changes its argument xs in place, which its caller cannot see across the "
        "sandbox (only values cross)"
    )

"""Values cross between tests and candidate unchanged, and only as plain builtins.

Honest values (huge ints, inf and nan, -0.0, frozensets, subclasses of builtins) arrive as
they were sent; values that only pretend (always-equal subclasses, self-referencing or
oversized replies, replies trickled a byte at a time) never win a pass.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flywheel.sandbox import Limits, Verdict

Run = Callable[..., Verdict]

HONEST = "def add(a, b):\n    return a + b\n"

# name: (an expression building the value, a check that `got` is exactly that value)
ROUND_TRIPS = {
    "int_5000_digits": ("10**5000", "type(got) is int and got == 10**5000"),
    "int_100k_digits": ("7**118_000", "type(got) is int and got == 7**118_000"),
    "negative_int": ("-(2**200)", "got == -(2**200)"),
    "bool_stays_bool": ("[True, 1, False]", "[type(x) for x in got] == [bool, int, bool]"),
    "inf": ("float('inf')", "got == math.inf"),
    "minus_inf": ("float('-inf')", "got == -math.inf"),
    "nan": ("float('nan')", "math.isnan(got)"),
    "minus_zero": ("-0.0", "got == 0 and math.copysign(1.0, got) == -1.0"),
    "complex_inf": ("complex(1, float('inf'))", "got.real == 1 and got.imag == math.inf"),
    "complex_nan": ("complex(float('nan'), -0.0)", "math.isnan(got.real)"),
    "lone_surrogate": ("'a\\ud800b'", "got == 'a\\ud800b'"),
    "bytes": ("b'\\x00\\xff'", "type(got) is bytes and got == b'\\x00\\xff'"),
    "bytearray": ("bytearray(b'ab')", "type(got) is bytearray and got == b'ab'"),
    "empty_set": ("set()", "type(got) is set and got == set()"),
    "empty_frozenset": ("frozenset()", "type(got) is frozenset and not got"),
    "frozenset": ("frozenset({1, 2})", "type(got) is frozenset and got == {1, 2}"),
    "nested": ("{(1, 2): [set(), {b'x'}]}", "got == {(1, 2): [set(), {b'x'}]}"),
    "empty_tuple_key": ("{(): (), 'k': [[], {}]}", "got == {(): (), 'k': [[], {}]}"),
}


def round_trip(build: str, check: str) -> tuple[str, str]:
    """A candidate that echoes its argument and builds the value itself; tests of both."""
    solution = f"def echo(x):\n    return x\n\ndef make():\n    return {build}\n"
    tests = (
        "import math\nfrom solution import echo, make\n\n"
        f"def test_echo():\n    got = echo({build})\n    assert {check}\n\n"
        f"def test_make():\n    got = make()\n    assert {check}\n"
    )
    return solution, tests


@pytest.mark.parametrize("case", list(ROUND_TRIPS.values()), ids=list(ROUND_TRIPS))
def test_honest_values_cross_both_ways_unchanged(run: Run, case: tuple[str, str]) -> None:
    verdict = run(*round_trip(*case))

    assert verdict.is_passed, verdict


def test_both_sides_may_print_big_ints(run: Run) -> None:
    solution = "def digits(n):\n    return len(str(n))\n"
    tests = (
        "from solution import digits\n\n"
        "def test_digits():\n    assert digits(10**5000) == 5001 == len(str(10**5000))\n"
    )

    assert run(solution, tests).is_passed


def test_subclasses_of_builtins_arrive_as_plain_builtins(run: Run) -> None:
    solution = """
import collections, enum
Point = collections.namedtuple('Point', 'x y')
class Colour(enum.IntEnum):
    RED = 1
def point():
    return Point(1, 2)
def ordered():
    return collections.OrderedDict([('b', 2), ('a', 1)])
def counted():
    return collections.Counter('abca')
def grouped():
    groups = collections.defaultdict(list)
    groups['x'].append(Point(3, 4))
    return groups
def colour():
    return Colour.RED
"""
    tests = """
from solution import point, ordered, counted, grouped, colour

def test_namedtuple():
    got = point()
    assert got == (1, 2) and type(got) is tuple

def test_ordered_dict():
    got = ordered()
    assert got == {'a': 1, 'b': 2} and type(got) is dict

def test_counter():
    assert counted() == {'a': 2, 'b': 1, 'c': 1}

def test_defaultdict_of_namedtuples():
    got = grouped()
    assert got == {'x': [(3, 4)]} and type(got['x'][0]) is tuple

def test_int_enum():
    got = colour()
    assert got == 1 and type(got) is int
"""

    verdict = run(solution, tests)

    assert verdict.is_passed, verdict


# Each subclass lies through every method it can override; only the base value may cross.
LIARS = {
    "int": (
        "class Liar(int):\n    __hash__ = int.__hash__\n    def __eq__(self, other):\n"
        "        return True\n    def __repr__(self):\n        return '3'\n"
        "    def __format__(self, spec):\n        return '3'\n"
        "    def __index__(self):\n        return 3\n    __int__ = __index__\n"
        "def add(a, b):\n    return Liar(0)\n"
    ),
    "str": (
        "class Liar(str):\n    __hash__ = str.__hash__\n    def __eq__(self, other):\n"
        "        return True\n    def __repr__(self):\n        return '3'\n"
        "    def __str__(self):\n        return '3'\n"
        "def add(a, b):\n    return Liar('wrong')\n"
    ),
    "dict": (
        "class Liar(dict):\n    def __eq__(self, other):\n        return True\n"
        "    def __repr__(self):\n        return '3'\n    def __iter__(self):\n"
        "        return iter([3])\n    def items(self):\n        return [(3, 3)]\n"
        "    def __len__(self):\n        return 1\n"
        "def add(a, b):\n    return Liar()\n"
    ),
    "tuple": (
        "class Liar(tuple):\n    def __eq__(self, other):\n        return True\n"
        "    def __repr__(self):\n        return '3'\n    def __iter__(self):\n"
        "        return iter([3])\n    def __len__(self):\n        return 1\n"
        "def add(a, b):\n    return Liar()\n"
    ),
    "float": (
        "class Liar(float):\n    def __eq__(self, other):\n        return True\n"
        "    def __repr__(self):\n        return '3.0'\n    def hex(self):\n"
        "        return (3.0).hex()\n"
        "def add(a, b):\n    return Liar(0.5)\n"
    ),
}


@pytest.mark.parametrize("solution", list(LIARS.values()), ids=list(LIARS))
def test_always_equal_subclasses_cannot_win(run: Run, solution: str) -> None:
    tests = "from solution import add\n\ndef test_add():\n    assert add(1, 2) == 3\n"

    verdict = run(solution, tests)

    assert not verdict.is_passed, verdict
    assert verdict.pass_fraction == 0.0


RESPONSE_FD = """
import fcntl, os
def response_fd():
    # The only descriptor above stderr that the candidate may write to: its reply pipe.
    for fd in range(3, 64):
        try:
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
                return fd
        except OSError:
            pass
"""

OVERSIZED = {
    "string_100_mb": "def add(a, b):\n    return 'x' * 100_000_000\n",
    "huge_nested_list": "def add(a, b):\n    row = [0] * 1000\n    return [row] * 100_000\n",
    "doubled_64_times": "def add(a, b):\n    x = [0]\n    for _ in range(64):\n"
    "        x = [x, x]\n    return x\n",
    "flood_the_reply_pipe": RESPONSE_FD
    + "def add(a, b):\n    fd = response_fd()\n    for _ in range(200):\n"
    "        os.write(fd, b'[' * 2**20)\n",
}


@pytest.mark.parametrize("solution", list(OVERSIZED.values()), ids=list(OVERSIZED))
def test_an_oversized_reply_is_an_output_limit(run: Run, solution: str) -> None:
    verdict = run(solution)

    assert verdict.reason == "output_limit", verdict
    assert verdict.tests[0].message.startswith("output_limit:")
    assert run(HONEST).is_passed  # both warm sandboxes still serve


def test_a_self_referencing_reply_fails_clearly(run: Run) -> None:
    solution = "def add(a, b):\n    loop = [a + b]\n    loop.append(loop)\n    return loop\n"

    verdict = run(solution)

    assert verdict.reason == "failed_tests", verdict
    assert "not a plain value" in verdict.tests[0].message
    assert "refers to itself" in verdict.tests[0].message


def test_a_too_deep_reply_fails_clearly(run: Run) -> None:
    solution = (
        "def add(a, b):\n    deep = a + b\n    for _ in range(100_000):\n"
        "        deep = [deep]\n    return deep\n"
    )

    verdict = run(solution)

    assert verdict.reason == "failed_tests", verdict
    assert "deeper than" in verdict.tests[0].message


def test_a_too_deep_reply_from_a_tampered_encoder_fails_clearly(run: Run) -> None:
    """The candidate owns its side of the codec; the test side's decoder is the guard."""
    solution = (
        "import sys\nsys.modules['literals'].MAX_DEPTH = 10**6\n"
        "def add(a, b):\n    deep = a + b\n    for _ in range(100_000):\n"
        "        deep = [deep]\n    return deep\n"
    )

    verdict = run(solution)

    assert verdict.reason == "failed_tests", verdict
    assert "reply is not a plain value" in verdict.tests[0].message  # refused by the test side
    assert "deeper than" in verdict.tests[0].message


def test_a_reply_trickled_a_byte_at_a_time_times_out_per_call(run: Run) -> None:
    solution = RESPONSE_FD + (
        "import time\ndef add(a, b):\n    fd = response_fd()\n    for _ in range(200):\n"
        "        os.write(fd, b'[')\n        time.sleep(0.1)\n"
    )
    limits = Limits(wall_s=20.0, call_timeout_s=1.5, cpu_s=4, memory_mb=256)

    verdict = run(solution, limits=limits)

    assert verdict.reason == "timeout", verdict
    assert verdict.duration_s < 8  # one deadline per call, not one per chunk read

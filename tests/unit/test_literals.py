"""The sandbox's value codec on its own: faithful for plain values, refusing everything else.

The end-to-end behaviour (through both sandboxes) is in tests/adversarial/test_values.py.
"""

from __future__ import annotations

import collections
import enum
import math
from collections.abc import Callable
from typing import Any

import pytest

from flywheel.sandbox.harness import literals

PLAIN = [
    None,
    True,
    0,
    -(10**5000),
    7**118_000,
    1.5,
    math.inf,
    -math.inf,
    complex(1, math.inf),
    "a\ud800b\n\"'",
    b"\x00\xff",
    bytearray(b"ab"),
    [],
    (),
    {},
    set(),
    frozenset(),
    frozenset({1, 2}),
    {(1, 2): [set(), {b"x"}], (): ((),)},
    [True, 1, 1.0],
]


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (True == 1 == 1.0 would hide a change)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    return bool(a == b)


@pytest.mark.parametrize("value", PLAIN, ids=lambda value: type(value).__name__)
def test_plain_values_round_trip_unchanged(value: object) -> None:
    assert same(literals.decode(literals.encode(value)), value)


def test_nan_and_minus_zero_round_trip() -> None:
    assert math.isnan(literals.decode(literals.encode(math.nan)))
    assert math.copysign(1.0, literals.decode(literals.encode(-0.0))) == -1.0


class Colour(enum.IntEnum):
    RED = 1


Point = collections.namedtuple("Point", "x y")


@pytest.mark.parametrize(
    ("value", "plain"),
    [
        (Point(1, 2), (1, 2)),
        (collections.OrderedDict(b=1, a=2), {"b": 1, "a": 2}),
        (collections.Counter("aab"), {"a": 2, "b": 1}),
        (collections.defaultdict(list, k=[Point(3, 4)]), {"k": [(3, 4)]}),
        (Colour.RED, 1),
    ],
)
def test_subclasses_decode_as_their_builtin_base(value: object, plain: object) -> None:
    assert same(literals.decode(literals.encode(value)), plain)


def test_subclass_overrides_are_never_consulted() -> None:
    class Liar(int):
        def __format__(self, spec: str) -> str:
            return "3"

        def __repr__(self) -> str:
            return "3"

    class Lies(list[int]):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter([3])

        def __len__(self) -> int:
            return 1

    assert literals.decode(literals.encode([Liar(0), Lies([0, 0])])) == [0, [0, 0]]


def test_shared_but_acyclic_parts_are_fine() -> None:
    part = [1]

    assert literals.decode(literals.encode([part, [part], part])) == [[1], [[1]], [1]]


def test_runs_of_one_type_encode_as_single_values_do() -> None:
    mixed = [1, -2, "a", None, True, 2.5, b"\x01", bytearray(b"z"), enum.IntEnum("E", "A").A]
    long = list(range(2 * literals.RUN_LENGTH + 3)) + ["s"] * literals.RUN_LENGTH + mixed

    assert literals.encode([3, 4, "a", None]) == '["l",4,"i","3","i","4","s","a","N",null]'
    assert same(literals.decode(literals.encode(long)), [*long[:-1], 1])


def test_a_value_built_by_doubling_one_part_is_refused_without_walking_it() -> None:
    # 2**64 leaves: walking them would never end; their text passes the limit at once.
    doubled: list[object] = [0]
    for _ in range(64):
        doubled = [doubled, doubled]

    with pytest.raises(literals.TooLarge):
        literals.encode(doubled)


def test_cycles_depth_and_other_types_are_refused() -> None:
    loop: list[object] = []
    loop.append(loop)
    deep: object = 0
    for _ in range(literals.MAX_DEPTH):
        deep = [deep]

    assert literals.decode(literals.encode(deep)) == deep
    with pytest.raises(literals.NotPlain, match="refers to itself"):
        literals.encode(loop)
    with pytest.raises(literals.NotPlain, match="nests deeper"):
        literals.encode([deep])
    for other in (object(), [len], memoryview(b"x"), {1: range(3)}):
        with pytest.raises(literals.NotPlain, match="holds an instance of"):
            literals.encode(other)


OVERSIZED = {  # built only when their test runs: 100 MB is not kept for the whole session
    "str": lambda: "x" * 100_000_000,
    "nested_list": lambda: [[0] * 1000] * 100_000,
    "bytes": lambda: b"x" * 10_000_000,
    "int": lambda: 1 << 100_000_000,
}


@pytest.mark.parametrize("build", list(OVERSIZED.values()), ids=list(OVERSIZED))
def test_values_over_the_size_limit_are_refused(build: Callable[[], object]) -> None:
    with pytest.raises(literals.TooLarge):
        literals.encode(build())


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[",
        "[1]",
        '["x",1]',
        '["l",2,"i","1"]',
        '["i","1","i","2"]',
        '["s",1]',
        '["b",1]',
        '["l",true]',
        '["l",-1]',
        '["S",1,"l",0]',
        '["i","zz"]',
        '["c",["1"]]',
        "[" * 100_000 + "]" * 100_000,
        "[" + '"l",1,' * (literals.MAX_DEPTH + 1) + '"N",null]',
        '["d",1,"i","1"]',
    ],
)
def test_malformed_text_is_refused(text: str) -> None:
    with pytest.raises(literals.NotPlain):
        literals.decode(text)

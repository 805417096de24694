"""Plain values as text: the only form in which anything crosses between tests and candidate.

Both harnesses use it both ways (the tests' arguments out, the candidate's results back).
What crosses unchanged: None, bool, int of any size, float (inf, -inf, nan, -0.0; a nan's
sign is not kept), complex, str (lone surrogates too), bytes, bytearray (it stays a
bytearray: a test may check its type or mutate it), list, tuple, dict, set and frozenset,
nested. An instance of a subclass of one of those (namedtuple, OrderedDict, Counter,
IntEnum...) is read through the builtin base class's own C methods, never through anything
the subclass overrides, and arrives as the plain base type (a dict subclass's keys in its
storage order). Everything else is refused: the side that decodes only ever builds
builtins, so the test side never holds an object the candidate made.

The text is one line of JSON: a flat array of (tag, payload) pairs in prefix order. A
container's payload is its length (a dict's: its number of pairs) and its items follow it,
so neither side recurses and a hostile text cannot overflow the stack:

    tag  type        payload
    N    None        null
    b    bool        true or false
    i    int         hex digits: linear time, and not bound by sys.int_max_str_digits
    f    float       float.hex (exact; also "inf", "-inf", "nan")
    c    complex     [float.hex(real), float.hex(imag)]
    s    str         the string, \\u-escaped (ASCII only: lone surrogates survive)
    y    bytes       hex digits
    Y    bytearray   hex digits
    l t S F  list, tuple, set, frozenset: item count, then the items
    d    dict        pair count, then key, value, key, value...

Limits, checked while encoding and again while decoding: containers nest at most
MAX_DEPTH deep (as deep as the old repr/literal_eval path went: the parser's 200 nested
brackets), and a text is at most MAX_TEXT_BYTES long.
"""

import itertools
import json
from json.encoder import encode_basestring_ascii

MAX_DEPTH = 200
# 16 MiB: a million-element list of ints fits with room to spare (honest answers are mostly
# bytes to kilobytes), while what the test side buffers and decodes stays well inside its
# address-space limit.
LIMIT_MIB = 16
MAX_TEXT_BYTES = LIMIT_MIB * 1024 * 1024

_DONE = object()


class NotPlain(Exception):
    """The value is not (or the text does not describe) a plain value; the message says why,
    to follow "... is not a plain value: "."""


class TooLarge(Exception):
    """The encoded text would be longer than MAX_TEXT_BYTES."""


def _quoted(text):
    return '"' + text + '"'


def _complex_payload(value):
    real, imag = complex.real.__get__(value), complex.imag.__get__(value)
    return f"[{_quoted(float.hex(real))},{_quoted(float.hex(imag))}]"


# Exact type: (tag, payload as JSON text) for values that hold no other values. Each reads
# the value with the builtin's own method, so a subclass's overrides never run.
_SCALARS = {
    type(None): lambda value: ("N", "null"),
    bool: lambda value: ("b", "true" if value else "false"),
    int: lambda value: ("i", _quoted(int.__format__(value, "x"))),
    float: lambda value: ("f", _quoted(float.hex(value))),
    complex: lambda value: ("c", _complex_payload(value)),
    str: lambda value: ("s", encode_basestring_ascii(str.__str__(value))),
    bytes: lambda value: ("y", _quoted(bytes.hex(value))),
    bytearray: lambda value: ("Y", _quoted(bytearray.hex(value))),
}

# Exact type: (tag, the items that follow it, snapshotted through the builtin's iterator).
_CONTAINERS = {
    list: lambda value: ("l", tuple(list.__iter__(value))),
    tuple: lambda value: ("t", tuple(tuple.__iter__(value))),
    set: lambda value: ("S", tuple(set.__iter__(value))),
    frozenset: lambda value: ("F", tuple(frozenset.__iter__(value))),
    dict: lambda value: ("d", tuple(itertools.chain.from_iterable(dict.items(value)))),
}


def _plain_type(value):
    """The builtin type `value` is encoded as: its own, or the builtin it subclasses."""
    kind = type(value)
    if kind in _SCALARS or kind in _CONTAINERS:
        return kind
    for base in (*_SCALARS, *_CONTAINERS):
        if issubclass(kind, base):
            return base
    raise NotPlain(f"it holds an instance of {kind.__name__}")


# Exact scalar type: the payload texts of a run of its values, built by C code a whole run at
# a time (a million-int answer encodes in a fraction of a second, not seconds). Same text as
# _SCALARS gives one value at a time.
_RUN_PAYLOADS = {
    type(None): lambda run: itertools.repeat("null", len(run)),
    bool: lambda run: map({True: "true", False: "false"}.__getitem__, run),
    int: lambda run: map('"{:x}"'.format, run),
    float: lambda run: map('"{}"'.format, map(float.hex, run)),
    str: lambda run: map(encode_basestring_ascii, run),
    bytes: lambda run: map('"{}"'.format, map(bytes.hex, run)),
}
_RUN_TAGS = {kind: _SCALARS[kind](kind())[0] for kind in _RUN_PAYLOADS}
RUN_LENGTH = 4096  # values encoded together: bounds the text built before its size is checked


def _least_run_size(kind, run):
    """A lower bound on the length of a run's payloads, known without building them."""
    if kind is str:
        return sum(map(str.__len__, run))
    if kind is bytes:
        return 2 * sum(map(bytes.__len__, run))
    if kind is int:
        return sum(map(int.bit_length, run)) // 4
    return 0


def _runs(items):
    """`items` in order, as (kind, run): consecutive values of one exact type in _RUN_PAYLOADS,
    at most RUN_LENGTH of them, or (None, item) for any other single item."""
    for kind, group in itertools.groupby(items, type):
        if kind in _RUN_PAYLOADS:
            while run := tuple(itertools.islice(group, RUN_LENGTH)):
                yield kind, run
        else:
            for item in group:
                yield None, item


class _Text:
    """The encoded pairs as ASCII bytes, refusing to grow past MAX_TEXT_BYTES."""

    def __init__(self):
        self.data = bytearray(b"[")

    def check_room(self, size):
        if len(self.data) + size + 1 > MAX_TEXT_BYTES:  # and the closing bracket
            raise TooLarge(f"over {LIMIT_MIB} MiB encoded")

    def add(self, tag, payload):
        pair = f'"{tag}",{payload},'
        self.check_room(len(pair))
        self.data += pair.encode("ascii")

    def add_run(self, kind, run):
        tag = _RUN_TAGS[kind]
        self.check_room(_least_run_size(kind, run) + len(run) * (len(tag) + 4))
        pairs = f'"{tag}",' + f',"{tag}",'.join(_RUN_PAYLOADS[kind](run)) + ","
        self.check_room(len(pairs))
        self.data += pairs.encode("ascii")

    def repeat(self, start, end):
        self.check_room(end - start)
        self.data += self.data[start:end]

    def __str__(self):
        return self.data[:-1].decode("ascii") + "]"


def encode(value):
    """`value` as one line of text (see the module docstring); NotPlain or TooLarge if not."""
    text = _Text()
    stack = [(_runs((value,)), None, 0)]  # (items still to encode, their container, its start)
    on_path = set()
    encoded = {}  # id: (container, start, end) of each container encoded so far
    while stack:
        runs, owner, start = stack[-1]
        kind, item = next(runs, (_DONE, None))
        if kind is _DONE:
            stack.pop()
            on_path.discard(id(owner))
            encoded[id(owner)] = (owner, start, len(text.data))
        elif kind is not None:
            text.add_run(kind, item)
        elif (kind := _plain_type(item)) in _SCALARS:
            text.check_room(_least_size(kind, item))  # before building a huge payload
            text.add(*_SCALARS[kind](item))
        elif encoded.get(id(item), (None,))[0] is item:
            # Met again (a list of one row repeated): its text again, without walking it.
            text.repeat(*encoded[id(item)][1:])
        else:
            if id(item) in on_path:
                raise NotPlain("it refers to itself")
            if len(stack) > MAX_DEPTH:
                raise NotPlain(f"it nests deeper than {MAX_DEPTH} containers")
            item_start = len(text.data)
            tag, children = _CONTAINERS[kind](item)
            text.add(tag, str(len(children) // 2 if kind is dict else len(children)))
            on_path.add(id(item))  # `encoded` keeps `item` alive, so its id stays unique
            stack.append((_runs(children), item, item_start))
    return str(text)


def _least_size(kind, value):
    """A lower bound on the length of a scalar's payload, known without building it."""
    if kind is str:
        return str.__len__(value)
    if kind in (bytes, bytearray):
        return 2 * kind.__len__(value)
    if kind is int:
        return int.bit_length(value) // 4
    return 0


def _payload(kind):
    """A check that a payload is a `kind` (exactly: JSON's true is no int count)."""

    def check(payload):
        if type(payload) is not kind:
            found = type(payload).__name__
            raise NotPlain(f"its text has a {found} payload, not a {kind.__name__}")
        return payload

    return check


def _decode_complex(payload):
    real, imag = _payload(list)(payload)
    return complex(float.fromhex(_payload(str)(real)), float.fromhex(_payload(str)(imag)))


_DECODE_SCALAR = {
    "N": _payload(type(None)),
    "b": _payload(bool),
    "i": lambda payload: int(_payload(str)(payload), 16),
    "f": lambda payload: float.fromhex(_payload(str)(payload)),
    "c": _decode_complex,
    "s": _payload(str),
    "y": lambda payload: bytes.fromhex(_payload(str)(payload)),
    "Y": lambda payload: bytearray.fromhex(_payload(str)(payload)),
}

# tag: (builds the container from its decoded items, how many items one count stands for)
_BUILD_CONTAINER = {
    "l": (list, 1),
    "t": (tuple, 1),
    "S": (set, 1),
    "F": (frozenset, 1),
    "d": (lambda items: dict(zip(items[0::2], items[1::2], strict=True)), 2),
}


class _Open:
    """A container being decoded: what builds it and the items it still waits for."""

    def __init__(self, build, expected):
        self.build = build
        self.expected = expected
        self.items = []

    @property
    def is_full(self):
        return len(self.items) == self.expected


def decode(text):
    """The plain value `text` describes, built from builtins only; NotPlain if it describes none.

    The text may come from the candidate: every payload is checked, nothing recurses, and
    containers nest at most MAX_DEPTH deep.
    """
    if len(text) > MAX_TEXT_BYTES:
        raise NotPlain(f"it is over {LIMIT_MIB} MiB encoded")
    try:
        tokens = json.loads(text)
        return _build(tokens)
    except NotPlain:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError) as error:
        raise NotPlain(f"its text is malformed ({type(error).__name__}: {error})"[:300]) from error


def _build(tokens):
    if type(tokens) is not list or len(tokens) % 2:
        raise NotPlain("its text is not a list of (tag, payload) pairs")
    pairs = zip(tokens[0::2], tokens[1::2], strict=True)
    stack = [_Open(lambda items: items[0], 1)]  # the whole text: one value
    for tag, payload in pairs:
        _take(stack, tag, payload)
        while stack[-1].is_full:
            done = stack.pop()
            value = done.build(done.items)
            if not stack:
                if next(pairs, None) is not None:
                    raise NotPlain("its text goes on after the value")
                return value
            stack[-1].items.append(value)
    raise NotPlain("its text ends before the value does")


def _take(stack, tag, payload):
    """Open the container a pair starts, or add the scalar it is to the innermost one."""
    if tag in _DECODE_SCALAR:
        stack[-1].items.append(_DECODE_SCALAR[tag](payload))
    elif tag in _BUILD_CONTAINER:
        if len(stack) > MAX_DEPTH:
            raise NotPlain(f"it nests deeper than {MAX_DEPTH} containers")
        count = _payload(int)(payload)
        if count < 0:
            raise NotPlain("it has a container of negative length")
        build, items_per_count = _BUILD_CONTAINER[tag]
        stack.append(_Open(build, items_per_count * count))
    else:
        raise NotPlain(f"its text has an unknown tag {str(tag)[:20]!r}")

"""Whether what a function returns can cross the sandbox: values cross only as literals
(`repr` -> `ast.literal_eval`), so a function that returns an iterator, a function or an
object of the repository's classes can never pass its tests there, however right it is.

Decided from the code, before any sandbox runs: each `return` is followed through local
names, `itertools` and the iterator builtins, and the repository's own functions (a
generator, or one that itself returns such a value), a few calls deep. What cannot be told
from the code (a value computed by a call the analysis does not follow) counts as a value;
verifier QA's reference run then says whether it crossed.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from ingest.repo.codebase import Codebase, is_stdlib

MAX_CALL_DEPTH = 3
ITERATOR_BUILTINS = frozenset({"iter", "map", "filter", "zip", "reversed", "enumerate", "range"})
ITERATOR_MODULES = frozenset({"itertools"})
ITERATOR_FUNCTIONS = frozenset(
    {("re", "finditer"), ("heapq", "merge"), ("os", "scandir"), ("os", "walk"), ("glob", "iglob")}
)
# What the sandbox's value encoding carries (flywheel/sandbox/harness/literals.py): these
# builtins, and objects of their subclasses (OrderedDict, Counter, namedtuples, IntEnum...),
# which arrive as the builtin they subclass.
PLAIN_TYPES = (
    type(None), bool, int, float, complex, str, bytes, bytearray, list, tuple, set, frozenset,
    dict,
)  # fmt: skip
# Standard-library modules never imported to look a name up: importing them does something.
NEVER_IMPORTED = frozenset(
    {"antigravity", "this", "turtle", "turtledemo", "tkinter", "idlelib", "webbrowser", "pydoc"}
)


MUTATORS = frozenset(
    {
        "append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault",
        "popitem", "sort", "reverse", "add", "discard", "difference_update",
        "intersection_update", "symmetric_difference_update", "appendleft", "extendleft",
        "popleft", "rotate",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Opaque:
    """What a function gives back that cannot cross: `reason` is the slug the run counts."""

    reason: str  # generator, returns_iterator, returns_function, returns_object, mutates_argument
    what: str  # "filter(...)", "windowed (a generator)"; for mutates_argument, the parameter

    def detail(self, name: str) -> str:
        if self.reason == "mutates_argument":
            return (
                f"{name} changes its argument {self.what} in place, which its caller cannot "
                "see across the sandbox (only values cross)"
            )
        return f"{name} returns {self.what}, which cannot cross the sandbox as a value"


def returned(codebase: Codebase, module: str, name: str) -> Opaque | None:
    """What `module.name` returns that cannot cross, if it is a module-level function (and
    bound once) whose code says so: a generator, an iterator, a function, an object."""
    binders = codebase.bindings(module).get(name, [])
    if len(binders) != 1 or not isinstance(binders[0], ast.FunctionDef):
        return None
    if is_generator(binders[0]):
        return Opaque("generator", "a generator")
    mutated = mutated_parameter(binders[0])
    if mutated is not None:
        return Opaque("mutates_argument", mutated)
    return opaque_return(codebase, module, binders[0])


def mutated_parameter(function: ast.FunctionDef) -> str | None:
    """A parameter the function changes in place (`items.append(x)`, `items[0] = x`,
    `del options[key]`, `obj.field = x`), unless it rebinds the name first; `*args` and
    `**kwargs` are the function's own."""
    nodes = own_nodes(function)
    rebound = {n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    arguments = function.args
    fresh = {arg.arg for arg in [arguments.vararg, arguments.kwarg] if arg is not None}
    parameters = {arg.arg for arg in _arguments(arguments)} - rebound - fresh  # not *args
    for node in nodes:
        changed: ast.expr | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            changed = node.func.value if node.func.attr in MUTATORS else None
        elif isinstance(node, ast.Subscript | ast.Attribute) and not isinstance(node.ctx, ast.Load):
            changed = node.value
        if isinstance(changed, ast.Name) and changed.id in parameters:
            return changed.id
    return None


def opaque_return(
    codebase: Codebase, module: str, function: ast.FunctionDef, depth: int = 0
) -> Opaque | None:
    """What of `function`'s return values cannot cross the sandbox, if anything."""
    scope = _Scope(codebase, module, function, depth)
    for node in own_nodes(function):
        if isinstance(node, ast.Return) and node.value is not None:
            found = scope.describe(node.value)
            if found is not None:
                return found
    return None


@functools.cache
def is_object_class(module: str, path: str) -> bool:
    """Whether `module.path` is a standard-library (or builtin) class whose objects cannot
    cross: `datetime.timedelta`, `decimal.Decimal`, `ValueError` (not `collections.Counter`,
    a dict)."""
    if not is_stdlib(module) or module.split(".")[0] in NEVER_IMPORTED:
        return False
    try:
        value: object = importlib.import_module(module)
        for part in path.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError, OSError):
        return False
    return isinstance(value, type) and not issubclass(value, PLAIN_TYPES)


def is_object_class_def(
    codebase: Codebase, module: str, definition: ast.ClassDef, depth: int = 0
) -> bool:
    """Whether the repository's class makes objects that cannot cross: none of its bases is
    plain, as far as they can be told (a base that cannot be told counts as plain)."""
    return all(_is_object_base(codebase, module, base, depth) for base in definition.bases)


def _is_object_base(codebase: Codebase, module: str, base: ast.expr, depth: int) -> bool:
    if not isinstance(base, ast.Name):
        return False  # `namedtuple("P", "x y")`, `typing.NamedTuple`, `Generic[T]`...
    if base.id == "object":
        return True
    symbol = codebase.resolve(module, base.id)
    if symbol is None:
        return is_object_class("builtins", base.id)
    if symbol.kind == "external":
        return is_object_class(symbol.module, symbol.name)
    binders = codebase.bindings(symbol.module).get(symbol.name, [])
    parent = binders[-1] if len(binders) == 1 else None
    if not isinstance(parent, ast.ClassDef) or depth >= MAX_CALL_DEPTH:
        return False
    return is_object_class_def(codebase, symbol.module, parent, depth + 1)


def is_generator(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(node, ast.Yield | ast.YieldFrom) for node in own_nodes(function))


def own_nodes(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    """The nodes of a function, not counting nested functions' and classes' bodies."""
    nodes: list[ast.AST] = []
    todo: list[ast.AST] = list(function.body)
    while todo:
        node = todo.pop()
        nodes.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))
    return nodes


class _Scope:
    """One function's names: what each local is bound to when it is bound just once by a
    plain assignment, which are nested functions, which name modules."""

    def __init__(
        self, codebase: Codebase, module: str, function: ast.FunctionDef, depth: int
    ) -> None:
        self.codebase, self.module, self.depth = codebase, module, depth
        self.bindings: Counter[str] = Counter(arg.arg for arg in _arguments(function.args))
        self.values: dict[str, ast.expr] = {}
        self.functions: set[str] = set()
        self.classes: set[str] = set()
        self.added: dict[str, list[ast.expr]] = {}  # `found.append(x)`: what `found` holds
        self.modules: dict[str, str] = {}  # local `import itertools as it`
        for node in own_nodes(function):
            self._note(node)

    def _note(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            self.bindings[node.id] += 1
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            if isinstance(node.targets[0], ast.Name):
                self.values[node.targets[0].id] = node.value
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            self.bindings[node.name] += 1
            (self.classes if isinstance(node, ast.ClassDef) else self.functions).add(node.name)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            container = node.func.value
            if node.func.attr in ("append", "add") and isinstance(container, ast.Name):
                self.added.setdefault(container.id, []).extend(node.args[:1])
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                self.bindings[bound] += 1
                if isinstance(node, ast.Import):
                    self.modules[bound] = alias.name

    def describe(self, node: ast.expr) -> Opaque | None:
        if isinstance(node, ast.GeneratorExp):
            return Opaque("returns_iterator", "a generator")
        if isinstance(node, ast.Lambda):
            return Opaque("returns_function", "a function")
        if isinstance(node, ast.IfExp):
            return self.describe(node.body) or self.describe(node.orelse)
        if isinstance(node, ast.ListComp | ast.SetComp):
            inner = self.describe(node.elt)
            kind = "list" if isinstance(node, ast.ListComp) else "set"
            return Opaque(inner.reason, f"a {kind} holding {inner.what}") if inner else None
        if isinstance(node, ast.Tuple | ast.List):
            inner = next(filter(None, map(self.describe, node.elts)), None)
            kind = type(node).__name__.lower()
            return Opaque(inner.reason, f"a {kind} holding {inner.what}") if inner else None
        if isinstance(node, ast.Name):
            return self._name(node.id)
        if isinstance(node, ast.Call):
            return self._call(node.func)
        return None

    def _name(self, name: str) -> Opaque | None:
        if self.bindings[name] != 1:
            return None
        if name in self.functions:
            return Opaque("returns_function", f"{name} (a function)")
        if name in self.classes:
            return Opaque("returns_object", f"{name} (a class)")
        value = self.values.get(name)
        inner = self.describe(value) if value is not None else None
        if inner is None and _is_empty_collection(value):
            inner = next(filter(None, map(self.describe, self.added.get(name, []))), None)
            inner = Opaque(inner.reason, f"a collection holding {inner.what}") if inner else None
        return Opaque(inner.reason, f"{name} ({inner.what})") if inner else None

    def _call(self, func: ast.expr) -> Opaque | None:
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            return self._attribute_call(func.value.id, func.attr, ast.unparse(func))
        if isinstance(func, ast.Name) and func.id in self.classes:
            return Opaque("returns_object", f"{_a(func.id)} object")
        if not isinstance(func, ast.Name) or func.id in self.bindings:
            return None
        return self._global_call(func.id)

    def _attribute_call(self, name: str, attr: str, shown: str) -> Opaque | None:
        """`itertools.islice(...)`, `chain.from_iterable(...)`, `dt.timedelta(...)`."""
        if name in self.modules:
            module, prefix = self.modules[name], ""
        elif name in self.bindings:
            return None  # a local value's method
        else:
            found = self._module_name(name)
            if found is None:
                return None
            module, prefix = found
        path = f"{prefix}.{attr}" if prefix else attr
        if module in ITERATOR_MODULES or (module, path) in ITERATOR_FUNCTIONS:
            return Opaque("returns_iterator", f"{shown}(...)")
        if is_object_class(module, path):
            return Opaque("returns_object", f"{_a(attr)} object")
        return None

    def _module_name(self, name: str) -> tuple[str, str] | None:
        """The standard-library module a module-level name stands for or comes from, and
        the name's path inside it: `("itertools", "")` for `it` after `import itertools as
        it`, `("itertools", "chain")` after `from itertools import chain`."""
        symbol = self.codebase.resolve(self.module, name)
        if symbol is None or symbol.kind != "external":
            return None
        binders = self.codebase.bindings(self.module).get(name, [])
        is_module = bool(binders) and isinstance(binders[-1], ast.Import)
        return symbol.module, "" if is_module else symbol.name

    def _global_call(self, name: str) -> Opaque | None:
        symbol = self.codebase.resolve(self.module, name)
        if symbol is None:
            is_builtin = name in ITERATOR_BUILTINS and hasattr(builtins, name)
            return Opaque("returns_iterator", f"{name}(...)") if is_builtin else None
        if symbol.kind == "external":
            is_iterator = symbol.module in ITERATOR_MODULES
            is_iterator |= (symbol.module, symbol.name) in ITERATOR_FUNCTIONS
            if is_iterator:
                return Opaque("returns_iterator", f"{name}(...)")
            is_object = is_object_class(symbol.module, symbol.name)
            return Opaque("returns_object", f"{_a(name)} object") if is_object else None
        definition = self._definition(symbol.module, symbol.name)
        if isinstance(definition, ast.ClassDef):
            is_object = is_object_class_def(self.codebase, symbol.module, definition)
            return Opaque("returns_object", f"{_a(name)} object") if is_object else None
        if not isinstance(definition, ast.FunctionDef):
            return None
        if is_generator(definition):
            return Opaque("returns_iterator", f"{name}(...) (a generator)")
        if self.depth >= MAX_CALL_DEPTH:
            return None
        inner = opaque_return(self.codebase, symbol.module, definition, self.depth + 1)
        return Opaque(inner.reason, f"{name}(...) ({inner.what})") if inner else None

    def _definition(self, module: str, name: str) -> ast.stmt | None:
        binders = self.codebase.bindings(module).get(name, [])
        return binders[-1] if len(binders) == 1 else None


def _arguments(arguments: ast.arguments) -> Iterator[ast.arg]:
    yield from [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    yield from filter(None, [arguments.vararg, arguments.kwarg])


def _is_empty_collection(node: ast.expr | None) -> bool:
    """`[]`, `set()`, `list()`: a collection filled by `append`/`add` later."""
    if isinstance(node, ast.List):
        return not node.elts
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return not node.args and node.func.id in ("list", "set")
    return False


def _a(name: str) -> str:
    """`a Box`, `an Error`."""
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"

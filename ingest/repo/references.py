"""What a test module's names refer to, and the test rewritten to reach `solution` instead.

In the sandbox, a test sees the candidate only as the module `solution`, and only literal
values cross to it and back. So every way a test reaches the repository's code — `import
pkg`, `import pkg.mod as m`, `from pkg.mod import f`, re-exports, star imports — becomes
`solution`; a module constant that is a plain literal is copied in as its value; and what
cannot cross is found here, before any sandbox runs: a lambda or a function passed as an
argument, objects of the repository's classes, module state, `__file__`, third-party imports,
pytest beyond `raises`.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass, field
from types import UnionType
from typing import Literal

from ingest.repo.codebase import Codebase, Symbol, is_stdlib
from ingest.repo.files import PythonFile, is_source
from ingest.repo.names import bound_names
from ingest.repo.values import is_object_class

SOLUTION = "solution"  # the module name under which the sandbox's tests see the candidate
BUILTINS = frozenset(dir(builtins))
# Builtins whose results the sandbox's value encoding refuses (iterators, views, objects).
OBJECT_MAKERS = frozenset(
    {
        "iter", "range", "map", "filter", "zip", "reversed", "enumerate", "object",
        "memoryview", "slice", "open", "type", "super", "vars", "globals", "locals",
    }
)  # fmt: skip

DICT_VIEWS = frozenset({"keys", "values", "items"})

BindingKind = Literal["source", "pytest", "stdlib", "test_helper", "third_party"]


@dataclass(frozen=True)
class Binding:
    """What a test module's top-level import binds a name to."""

    kind: BindingKind
    module: str  # the module imported from (for pytest: "pytest")
    name: str = ""  # the name imported from it ("" for a module itself)


@dataclass
class ParsedTestFile:
    file: PythonFile
    module: str
    bindings: dict[str, Binding] = field(default_factory=dict)
    star_sources: list[str] = field(default_factory=list)
    has_other_stars: bool = False  # `from math import *`: names may come from anywhere
    top_level: set[str] = field(default_factory=set)  # every name bound at module level


def read_test_module(codebase: Codebase, file: PythonFile) -> ParsedTestFile:
    module = ParsedTestFile(file, codebase.module_of_path.get(file.path, ""))
    for statement in file.tree.body:
        module.top_level |= bound_names(statement)
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                bound = alias.asname or alias.name.split(".")[0]
                imported = alias.name if alias.asname else bound
                module.bindings[bound] = _binding(codebase, imported, "")
        elif isinstance(statement, ast.ImportFrom):
            _read_import_from(codebase, module, statement)
        elif isinstance(statement, ast.Assign):
            _read_pytest_alias(module, statement)
    return module


def _read_import_from(codebase: Codebase, module: ParsedTestFile, node: ast.ImportFrom) -> None:
    origin = codebase.absolute(module.module, node)
    for alias in node.names:
        if alias.name != "*":
            module.bindings[alias.asname or alias.name] = _binding(codebase, origin, alias.name)
        elif _binding(codebase, origin, "").kind == "source":
            module.star_sources.append(origin)
        else:
            module.has_other_stars = True


def _read_pytest_alias(module: ParsedTestFile, node: ast.Assign) -> None:
    """`parametrize = pytest.mark.parametrize`: the name is that part of pytest."""
    parts: list[str] = []
    value: ast.expr = node.value
    while isinstance(value, ast.Attribute):
        parts.insert(0, value.attr)
        value = value.value
    binding = module.bindings.get(value.id) if isinstance(value, ast.Name) else None
    targets = [target.id for target in node.targets if isinstance(target, ast.Name)]
    if binding is None or binding.kind != "pytest" or len(targets) != len(node.targets):
        return
    path = ".".join(filter(None, [binding.name, *parts]))
    for target in targets:
        module.bindings[target] = Binding("pytest", "pytest", path)


def _binding(codebase: Codebase, module: str, name: str) -> Binding:
    top = module.split(".")[0]
    if top == "pytest":
        return Binding("pytest", "pytest", ".".join(filter(None, [*module.split(".")[1:], name])))
    if codebase.is_in_repo(module):
        path = codebase.path_of_module.get(module)
        if path is not None and not is_source(path):
            return Binding("test_helper", module, name)
        return Binding("source", module, name)
    if is_stdlib(module):
        return Binding("stdlib", module, name)
    return Binding("third_party", module, name)


class References(ast.NodeVisitor):
    """Visit a test (and the module statements it needs): the source functions it calls,
    the literal constants it reads, and what keeps it out of the sandbox (`problems`)."""

    def __init__(self, codebase: Codebase, module: ParsedTestFile) -> None:
        self.codebase = codebase
        self.module = module
        self.symbols: set[Symbol] = set()  # functions, and whatever else makes it unusable
        self.constants: dict[Symbol, str] = {}
        self.problems: list[tuple[str, str]] = []
        self.free_names: set[str] = set()
        self._local_names: set[str] = set()
        self._changed: set[int] = set()  # ids of nodes the test changes in place
        self._called: set[int] = set()  # ids of nodes the test calls
        self._objects: set[str] = set()  # local names bound to functions, iterators...
        self._classes: set[str] = set()  # classes the test defines in itself
        self._scanning: ast.AST | None = None

    def scan(self, part: ast.AST, free_names: set[str]) -> None:
        self.free_names |= free_names
        self._scanning = part
        for node in ast.walk(part):
            self._note_local_object(node)
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                self._local_names.add(node.id)
            elif isinstance(node, ast.arg):
                self._local_names.add(node.arg)
            elif isinstance(node, ast.Call):
                self._called.add(id(node.func))
                if isinstance(node.func, ast.Attribute):
                    self._changed.add(id(node.func.value))
            elif isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
                self._changed.add(id(node.value))
        self.visit(part)

    def _note_local_object(self, node: ast.AST) -> None:
        """Remember names a test binds to what cannot cross: `key = lambda x: -x`, a nested
        `def`, `it = iter(items)`."""
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node is not self._scanning:
            self._objects.add(node.name)
            if isinstance(node, ast.ClassDef):
                self._classes.add(node.name)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and self.non_literal(node.value) is not None:
                self._objects.add(target.id)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        path = self.pytest_path(node)
        if path is not None:
            self._pytest(path)
            return
        resolved = self.resolve_chain(node)
        if resolved is None:
            self.generic_visit(node)
        elif resolved.symbol is not None:
            self._use(resolved.symbol, resolved.node)

    def visit_Call(self, node: ast.Call) -> None:
        if self.pytest_path(node.func) == "raises" and (node.keywords or len(node.args) != 1):
            self.problems.append(("pytest_feature", "pytest.raises with more than the type"))
        if self._calls_source(node.func):
            for argument in [*node.args, *(keyword.value for keyword in node.keywords)]:
                what = self.non_literal(argument)
                if what is not None:
                    shown = ast.unparse(node.func)
                    self.problems.append(("non_literal_argument", f"passes {what} to {shown}"))
        self.generic_visit(node)

    def visit_withitem(self, node: ast.withitem) -> None:
        call = node.context_expr
        is_raises = isinstance(call, ast.Call) and self.pytest_path(call.func) == "raises"
        if is_raises and node.optional_vars is not None:
            self.problems.append(("pytest_feature", "pytest.raises(...) as info"))
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == SOLUTION:
            self.problems.append(("name_clash", f"the test itself uses the name {SOLUTION}"))
        if node.id == "__file__":
            self.problems.append(("uses_files", "reads files next to the test"))
        if not isinstance(node.ctx, ast.Load):
            return
        binding = self.module.bindings.get(node.id)
        if binding is None:
            self._unbound(node)
        elif binding.kind == "source":
            symbol = self.codebase.resolve(binding.module, binding.name) if binding.name else None
            if symbol is None or symbol.kind == "module":
                self.problems.append(("module_state", f"uses the module {binding.module} itself"))
            else:
                self._use(symbol, node)
        elif binding.kind == "pytest":
            self._pytest(binding.name)
        elif binding.kind in ("third_party", "test_helper"):
            kind = "third_party_imports" if binding.kind == "third_party" else "test_helper_import"
            self.problems.append((kind, f"needs {binding.module}"))

    def _use(self, symbol: Symbol, node: ast.expr) -> None:
        if symbol.kind == "function" and id(node) not in self._called:
            shown = f"{symbol.module}.{symbol.name}"
            self.problems.append(("function_as_value", f"uses {shown} without calling it"))
        literal = self.codebase.literal(symbol) if id(node) not in self._changed else None
        if literal is not None:
            self.constants[symbol] = literal
        else:
            self.symbols.add(symbol)

    def _pytest(self, path: str) -> None:
        """The sandbox's pytest has `raises`; marks and params are rewritten away."""
        if path not in ("raises", "param") and not path.startswith("mark."):
            self.problems.append(("pytest_feature", f"pytest.{path}"))

    def _unbound(self, node: ast.Name) -> None:
        """A name the test module does not bind: from a star import, or undefined (`pytest`
        is bound: the rewrite of `self.assertRaises` names it, and the runner offers it)."""
        name = node.id
        if name in self.module.top_level or name in BUILTINS or name not in self.free_names:
            return
        for star in self.module.star_sources:
            symbol = self.codebase.resolve(star, name)
            if symbol is not None:
                self._use(symbol, node)
                return
        if not self.module.has_other_stars and name != "pytest":  # `reveal_type`, for mypy
            self.problems.append(("undefined_name", f"{name} is not defined"))

    def source_symbol(self, node: ast.expr) -> Symbol | None:
        """The repository's name an expression (`f`, `mod.f`, `pkg.mod.f`) stands for."""
        if isinstance(node, ast.Attribute):
            resolved = self.resolve_chain(node)
            return resolved.symbol if resolved is not None and resolved.is_whole else None
        if not isinstance(node, ast.Name) or node.id in self._local_names:
            return None
        binding = self.module.bindings.get(node.id)
        if binding is not None and binding.kind == "source" and binding.name:
            return self.codebase.resolve(binding.module, binding.name)
        if binding is None and node.id not in self.module.top_level:
            for star in self.module.star_sources:
                symbol = self.codebase.resolve(star, node.id)
                if symbol is not None:
                    return symbol
        return None

    def _calls_source(self, func: ast.expr) -> bool:
        symbol = self.source_symbol(func)
        return symbol is not None and symbol.kind == "function"

    def non_literal(self, node: ast.expr) -> str | None:
        """What about an argument cannot cross to the candidate as a literal, if anything."""
        if isinstance(node, ast.Lambda | ast.GeneratorExp):
            return "a lambda" if isinstance(node, ast.Lambda) else "a generator"
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            return next(filter(None, map(self.non_literal, node.elts)), None)
        if isinstance(node, ast.Dict):
            parts = [part for part in [*node.keys, *node.values] if part is not None]
            return next(filter(None, map(self.non_literal, parts)), None)
        if isinstance(node, ast.Starred):
            return self.non_literal(node.value)
        if isinstance(node, ast.Call):
            return self._made(node)
        symbol = self.source_symbol(node)
        if symbol is not None and symbol.kind in ("function", "class"):
            return f"the {symbol.kind} {symbol.name}"
        name = node.id if isinstance(node, ast.Name) else None
        if name in self._objects:
            return f"the object {name}"
        if name is None or name in self._local_names:
            return None
        is_callable = name in BUILTINS or self._defines(name, ast.FunctionDef | ast.ClassDef)
        return f"the callable {name}" if is_callable else None

    def _made(self, call: ast.Call) -> str | None:
        """What a call makes, when that cannot cross: `iter(...)`, a dict view, an object of
        a standard-library class or of a class the test defines."""
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in DICT_VIEWS and not call.args:
            return "a dict view"
        stdlib = self._stdlib_path(func)
        if stdlib is not None:
            module, path = stdlib
            owner = path.rpartition(".")[0]  # `date.today()` makes a date too
            if is_object_class(module, path) or (owner and is_object_class(module, owner)):
                return f"a {(owner or path).split('.')[-1]} object"
        if not isinstance(func, ast.Name) or func.id in self._local_names:
            return None
        called = func.id
        if called in self._classes or self._defines(called, ast.ClassDef):
            return f"an instance of {called}"
        if called in OBJECT_MAKERS:
            return f"{called}(...)"
        is_object = called in BUILTINS and called not in self.module.top_level
        return f"a {called} object" if is_object and is_object_class("builtins", called) else None

    def _stdlib_path(self, node: ast.expr) -> tuple[str, str] | None:
        """`("datetime", "timedelta")` for `dt.timedelta` after `import datetime as dt`."""
        attrs: list[str] = []
        while isinstance(node, ast.Attribute):
            attrs.insert(0, node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id in self._local_names:
            return None
        binding = self.module.bindings.get(node.id)
        if binding is None or binding.kind != "stdlib":
            return None
        path = [binding.name, *attrs] if binding.name else attrs
        return (binding.module, ".".join(path)) if path else None

    def _defines(self, name: str, kind: type[ast.stmt] | UnionType) -> bool:
        """Whether the test module defines `name` at top level as a `kind` (a class...)."""
        return any(
            isinstance(statement, kind) and getattr(statement, "name", None) == name
            for statement in self.module.file.tree.body
        )

    def resolve_chain(self, node: ast.Attribute) -> Chain | None:
        """For `pkg.mod.f.x`: that `pkg.mod` is a module and `f` what follows it; None when
        the chain does not start at an imported source module."""
        chain: list[str] = []
        current: ast.expr = node
        while isinstance(current, ast.Attribute):
            chain.insert(0, current.attr)
            current = current.value
        if not isinstance(current, ast.Name) or current.id in self._local_names:
            return None
        module = self._module_of(current.id)
        if module is None:
            return None
        for depth, attr in enumerate(chain):
            symbol = self.codebase.resolve(module, attr)
            if symbol is None or symbol.kind != "module":
                found = symbol or Symbol(module, attr, "value")
                return Chain(depth, found, depth == len(chain) - 1, _node_at(node, depth))
            module = symbol.module
        self.problems.append(("module_state", f"uses the module {module} itself"))
        return Chain(len(chain), None, False, node)

    def _module_of(self, name: str) -> str | None:
        binding = self.module.bindings.get(name)
        if binding is None or binding.kind != "source":
            return None
        if not binding.name:
            return binding.module
        symbol = self.codebase.resolve(binding.module, binding.name)
        return symbol.module if symbol is not None and symbol.kind == "module" else None

    def pytest_path(self, node: ast.expr) -> str | None:
        """`mark.parametrize` for `pytest.mark.parametrize` (however pytest was imported)."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.insert(0, node.attr)
            node = node.value
        binding = self.module.bindings.get(node.id) if isinstance(node, ast.Name) else None
        if binding is None or binding.kind != "pytest":
            return None
        return ".".join(filter(None, [binding.name, *parts]))

    def rewrite(self, node: ast.stmt) -> ast.stmt:
        rewritten: ast.stmt = ToSolution(self).visit(node)
        return ast.fix_missing_locations(rewritten)

    def import_text(
        self, statement: ast.Import | ast.ImportFrom, alias: ast.alias, binding: Binding
    ) -> str | None:
        """`from solution import f as g` for a source function, `g = <value>` for a literal
        constant; stdlib and pytest imports as written; None for what is not kept."""
        bound = alias.asname or alias.name.split(".")[0]
        if binding.kind == "source":
            symbol = self.codebase.resolve(binding.module, binding.name) if binding.name else None
            if symbol is None or symbol.kind == "module":
                return None  # `pkg.mod.f` is rewritten to `solution.f` where it is used
            if symbol in self.constants:
                return f"{bound} = {self.constants[symbol]}"
            renamed = f" as {bound}" if bound != symbol.name else ""
            return f"from {SOLUTION} import {symbol.name}{renamed}"
        if binding.kind not in ("stdlib", "pytest"):
            return None
        if isinstance(statement, ast.Import):
            return ast.unparse(ast.Import(names=[alias]))
        return ast.unparse(ast.ImportFrom(statement.module, [alias], 0))


@dataclass(frozen=True)
class Chain:
    """An attribute chain through source modules: `pkg.mod.f.x` has depth 2 (`pkg.mod`),
    symbol `f`, and is whole when `f` ends it."""

    depth: int
    symbol: Symbol | None
    is_whole: bool
    node: ast.expr  # the node that ends at the symbol (`pkg.mod.f`)


def _node_at(node: ast.Attribute, depth: int) -> ast.expr:
    """The sub-chain of `node` that ends at attribute number `depth`."""
    nodes: list[ast.expr] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        nodes.insert(0, current)
        current = current.value
    return nodes[depth]


class ToSolution(ast.NodeTransformer):
    """`pkg.mod.f(x)` -> `solution.f(x)`; `pkg.CONSTANT` -> its literal value."""

    def __init__(self, references: References) -> None:
        self.references = references

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        chain = self.references.resolve_chain(node)
        if chain is None:
            return self.generic_visit(node)  # type: ignore[return-value]
        attrs: list[str] = []
        current: ast.expr = node
        while isinstance(current, ast.Attribute):
            attrs.insert(0, current.attr)
            current = current.value
        constant = self.references.constants.get(chain.symbol) if chain.symbol else None
        if constant is not None:
            rebuilt: ast.expr = ast.parse(constant, mode="eval").body
            rest = attrs[chain.depth + 1 :]
        else:
            rebuilt, rest = ast.Name(SOLUTION, ast.Load()), attrs[chain.depth :]
        for attr in rest:
            rebuilt = ast.Attribute(rebuilt, attr, ast.Load())
        return ast.copy_location(rebuilt, node)

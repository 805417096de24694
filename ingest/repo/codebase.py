"""One snapshot's Python code as modules: which file is which module, and what a name is.

Tests import names from wherever the package exposes them (`from pkg import f`, where
`pkg/__init__.py` re-exports `f` from `pkg/core.py`), so a name is resolved through in-repo
re-exports to the statement that defines it.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from typing import Literal

from ingest.repo.files import PythonFile, Skipped, Snapshot, module_names, read_python
from ingest.repo.names import bound_names

MAX_REEXPORT_DEPTH = 8
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}

SymbolKind = Literal["function", "async_function", "class", "value", "module", "external"]


@dataclass(frozen=True)
class Symbol:
    """What a module-level name is, where it is defined."""

    module: str  # the defining module (for "module": the module itself)
    name: str
    kind: SymbolKind


class Codebase:
    """The modules of a snapshot, parsed on first use."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.paths = snapshot.python_paths()
        self.module_of_path = module_names(self.paths)
        self.path_of_module = {name: path for path, name in self.module_of_path.items()}
        self._files: dict[str, PythonFile | Skipped] = {}
        self._bindings: dict[str, dict[str, list[ast.stmt]]] = {}
        self._literals: dict[Symbol, str | None] = {}

    def read(self, path: str) -> PythonFile | Skipped:
        if path not in self._files:
            try:
                self._files[path] = read_python(self.snapshot, path)
            except Skipped as skipped:
                self._files[path] = skipped
        return self._files[path]

    def file(self, path: str) -> PythonFile | None:
        read = self.read(path)
        return read if isinstance(read, PythonFile) else None

    def module(self, name: str) -> PythonFile | None:
        path = self.path_of_module.get(name)
        return self.file(path) if path is not None else None

    def is_package(self, name: str) -> bool:
        return self.path_of_module.get(name, "").endswith("__init__.py")

    def is_in_repo(self, module: str) -> bool:
        """A module (or package prefix of one) that this snapshot holds."""
        prefix = module + "."
        return module in self.path_of_module or any(
            name.startswith(prefix) for name in self.path_of_module
        )

    def absolute(self, importer: str, node: ast.ImportFrom) -> str:
        """The module an ImportFrom in module `importer` names, relative levels resolved."""
        if not node.level:
            return node.module or ""
        package = importer.split(".")
        if not self.is_package(importer):
            package = package[:-1]
        package = package[: len(package) - (node.level - 1)] if node.level > 1 else package
        return ".".join([*package, *([node.module] if node.module else [])])

    def resolve(self, module: str, name: str, depth: int = 0) -> Symbol | None:
        """What `module.name` is, following in-repo re-exports; None if nothing binds it."""
        if depth > MAX_REEXPORT_DEPTH:
            return None
        source = self.module(module)
        binders = self.bindings(module).get(name)
        binding = binders[-1] if binders else None
        if binding is None:
            submodule = f"{module}.{name}"
            if submodule in self.path_of_module:
                return Symbol(submodule, name, "module")
            return self._resolve_star(module, source, name, depth)
        if isinstance(binding, ast.ImportFrom):
            return self._resolve_from(module, binding, name, depth)
        if isinstance(binding, ast.Import):
            imported = _imported_module(binding, name)
            kind: SymbolKind = "module" if self.is_in_repo(imported) else "external"
            return Symbol(imported, name, kind)
        return Symbol(module, name, _kind(binding))

    def bindings(self, module: str) -> dict[str, list[ast.stmt]]:
        """Each name a module binds at top level, with the statements that bind it."""
        if module not in self._bindings:
            source = self.module(module)
            found: dict[str, list[ast.stmt]] = {}
            for statement in source.tree.body if source is not None else []:
                for name in bound_names(statement):
                    found.setdefault(name, []).append(statement)
            self._bindings[module] = found
        return self._bindings[module]

    def literal(self, symbol: Symbol) -> str | None:
        """The source of a module constant that is a plain literal (`UNCOUNTABLES = {...}`)
        assigned once and never changed in place by its module; None for anything else.
        Tests may use such a constant: it is copied into them as a value."""
        if symbol not in self._literals:
            self._literals[symbol] = self._literal(symbol)
        return self._literals[symbol]

    def _literal(self, symbol: Symbol) -> str | None:
        source = self.module(symbol.module)
        if source is None or symbol.kind != "value":
            return None
        bindings = self.bindings(symbol.module).get(symbol.name, [])
        if len(bindings) != 1 or not isinstance(bindings[0], ast.Assign | ast.AnnAssign):
            return None
        value = bindings[0].value
        if value is None or is_mutated(source.tree, symbol.name, bindings[0]):
            return None
        try:
            ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        return ast.unparse(value)

    def _resolve_star(
        self, module: str, source: PythonFile | None, name: str, depth: int
    ) -> Symbol | None:
        """`from .more import *` in a package's `__init__`: the name may come from there."""
        for node in reversed(_star_imports(source)):
            origin = self.absolute(module, node)
            if self.is_in_repo(origin):
                symbol = self.resolve(origin, name, depth + 1)
                if symbol is not None:
                    return symbol
        return None

    def _resolve_from(
        self, module: str, node: ast.ImportFrom, name: str, depth: int
    ) -> Symbol | None:
        origin = self.absolute(module, node)
        original = next(alias.name for alias in node.names if (alias.asname or alias.name) == name)
        if not self.is_in_repo(origin):
            return Symbol(origin, original, "external")
        if f"{origin}.{original}" in self.path_of_module:
            return Symbol(f"{origin}.{original}", original, "module")
        return self.resolve(origin, original, depth + 1)


def is_mutated(tree: ast.AST, name: str, besides: ast.AST | None = None) -> bool:
    """Whether code changes `name` in place or rebinds it (`name.add(x)`, `name[k] = v`,
    `global name`), going by the code alone."""
    return any(node is not besides and _changes(node, name) for node in ast.walk(tree))


def _changes(node: ast.AST, name: str) -> bool:
    if isinstance(node, ast.Global):
        return name in node.names
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return _names(node.func.value, name)
    if isinstance(node, ast.Subscript | ast.Attribute) and not isinstance(node.ctx, ast.Load):
        return _names(node.value, name)
    return isinstance(node, ast.AugAssign) and _names(node.target, name)


def _names(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _star_imports(source: PythonFile | None) -> list[ast.ImportFrom]:
    if source is None:
        return []
    return [
        node
        for node in source.tree.body
        if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names)
    ]


def _imported_module(node: ast.Import, name: str) -> str:
    for alias in node.names:
        if alias.asname == name:
            return alias.name
        if alias.asname is None and alias.name.split(".")[0] == name:
            return name
    return name


def _kind(statement: ast.stmt) -> SymbolKind:
    if isinstance(statement, ast.FunctionDef):
        return "function"
    if isinstance(statement, ast.AsyncFunctionDef):
        return "async_function"
    if isinstance(statement, ast.ClassDef):
        return "class"
    return "value"


def is_stdlib(module: str) -> bool:
    return module.split(".")[0] in STDLIB

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
        binding = _last_binding(source.tree.body, name) if source is not None else None
        if binding is None:
            submodule = f"{module}.{name}"
            return Symbol(submodule, name, "module") if submodule in self.path_of_module else None
        if isinstance(binding, ast.ImportFrom):
            return self._resolve_from(module, binding, name, depth)
        if isinstance(binding, ast.Import):
            imported = _imported_module(binding, name)
            kind: SymbolKind = "module" if self.is_in_repo(imported) else "external"
            return Symbol(imported, name, kind)
        return Symbol(module, name, _kind(binding))

    def _resolve_from(
        self, module: str, node: ast.ImportFrom, name: str, depth: int
    ) -> Symbol | None:
        origin = self.absolute(module, node)
        original = next(
            alias.name for alias in node.names if (alias.asname or alias.name) == name
        )
        if not self.is_in_repo(origin):
            return Symbol(origin, original, "external")
        if f"{origin}.{original}" in self.path_of_module:
            return Symbol(f"{origin}.{original}", original, "module")
        return self.resolve(origin, original, depth + 1)


def _last_binding(statements: list[ast.stmt], name: str) -> ast.stmt | None:
    binding = None
    for statement in statements:
        if name in bound_names(statement):
            binding = statement
    return binding


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

"""Find a repository's tests, what source functions each one calls, and rewrite them to call
the sandbox's `solution` module instead.

Every test gets the source functions it reaches — through `import pkg`, `import pkg.mod as m`,
`from pkg.mod import f`, re-exports, star imports — and either plain code the runner can
collect or the reason it cannot run there. The test module's own constants and helpers that a
test needs travel with it; its imports must be the standard library or pytest (of which the
sandbox offers `pytest.raises` alone).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from ingest.repo.codebase import Codebase, Symbol
from ingest.repo.files import is_test_file
from ingest.repo.names import bound_names, closure, used_names
from ingest.repo.references import SOLUTION, ParsedTestFile, References, read_test_module
from ingest.repo.rewrite import SETUP_METHODS, Unsupported, plain_test
from ingest.repo.values import returned

__all__ = ["SOLUTION", "FoundTest", "discover_tests"]


@dataclass(frozen=True)
class FoundTest:
    """One test of the repository, as it will run in the sandbox (or why it cannot)."""

    origin: str  # "tests/test_text.py::TestSlug::test_spaces"
    name: str  # its function name in the rewritten tests
    targets: frozenset[Symbol]  # the source names it uses
    code: str = ""  # the rewritten function
    setup: tuple[tuple[frozenset[str], str], ...] = ()  # statements it needs: (names, code)
    reason: str | None = None
    detail: str = ""


def discover_tests(codebase: Codebase, paths: list[str] | None = None) -> Iterator[FoundTest]:
    """Every test function and test method in the snapshot's test files (or in `paths`), in
    file order."""
    for path in codebase.paths if paths is None else paths:
        if not is_test_file(path):
            continue
        file = codebase.file(path)
        if file is None:
            continue
        module = read_test_module(codebase, file)
        for node, class_name in _test_functions(file.tree):
            yield _found(codebase, module, node, class_name)


TestDef = ast.FunctionDef | ast.AsyncFunctionDef


def _test_functions(tree: ast.Module) -> Iterator[tuple[TestDef, str | None]]:
    """What pytest would collect: `test*` functions, `test*` methods of `Test*` classes and
    of unittest TestCases (with the class's name)."""
    for node in tree.body:
        if isinstance(node, TestDef) and node.name.startswith("test"):
            yield node, None
        elif isinstance(node, ast.ClassDef) and (
            node.name.startswith("Test") or any("TestCase" in ast.unparse(b) for b in node.bases)
        ):
            for item in node.body:
                if isinstance(item, TestDef) and item.name.startswith("test"):
                    yield item, node.name


def _found(
    codebase: Codebase, module: ParsedTestFile, node: TestDef, class_name: str | None
) -> FoundTest:
    origin = "::".join(filter(None, [module.file.path, class_name, node.name]))
    name = f"test_{class_name}_{node.name}" if class_name else node.name
    references = References(codebase, module)
    try:
        test = _converted(references, node, name, class_name)
    except Unsupported as unsupported:
        _scan(references, module, node)  # still say which functions it was for
        targets = frozenset(references.symbols)
        return FoundTest(
            origin, name, targets, reason=unsupported.reason, detail=unsupported.detail
        )
    needed = _scan(references, module, test)
    targets = frozenset(references.symbols)
    try:
        _check_references(references, targets)
    except Unsupported as unsupported:
        return FoundTest(
            origin, name, targets, reason=unsupported.reason, detail=unsupported.detail
        )
    wanted = set().union(*(used_names(part) for part in [test, *needed]))
    setup = tuple(
        entry for statement in needed for entry in _rendered(references, statement, wanted)
    )
    return FoundTest(origin, name, targets, ast.unparse(references.rewrite(test)), setup)


def _converted(
    references: References, node: TestDef, name: str, class_name: str | None
) -> ast.FunctionDef:
    if isinstance(node, ast.AsyncFunctionDef):
        raise Unsupported("async_test", f"{node.name} is a coroutine")
    _check_class(references.module.file.tree, class_name)
    test = plain_test(
        node, name=name, pytest_paths=references.pytest_path, is_method=class_name is not None
    )
    return _crossing_cases(references, test)


def _crossing_cases(references: References, test: ast.FunctionDef) -> ast.FunctionDef:
    """Leave out the parametrized cases (the loops `plain_test` made) holding a value that
    cannot cross to the candidate — a timedelta, a dict view, a generator — as skipped ones
    are; Unsupported when no case is left."""
    body = test.body
    while len(body) == 1 and isinstance(body[0], ast.For) and isinstance(body[0].iter, ast.List):
        cases = body[0].iter
        found = [references.non_literal(case) for case in cases.elts]
        if cases.elts and all(found):
            raise Unsupported("non_literal_argument", f"every case of {test.name} holds {found[0]}")
        cases.elts = [case for case, what in zip(cases.elts, found, strict=True) if what is None]
        body = body[0].body
    return test


def _scan(references: References, module: ParsedTestFile, node: ast.AST) -> list[ast.stmt]:
    """Scan a test and the module statements it needs; those statements."""
    needed = _needed(module, node)
    for part in [node, *needed]:
        references.scan(part, used_names(part))
    return needed


def _needed(module: ParsedTestFile, node: ast.AST) -> list[ast.stmt]:
    """The test module's top-level statements a test reads (constants, helpers, imports)."""
    statements = module.file.tree.body
    return [
        statements[index]
        for index in closure(statements, used_names(node), effects=False)
        if statements[index] is not node
    ]


def _check_class(tree: ast.Module, class_name: str | None) -> None:
    """A test class must hold nothing a method could depend on besides its tests."""
    if class_name is None:
        return
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    names = {item.name for item in cls.body if isinstance(item, ast.FunctionDef)}
    if names & SETUP_METHODS or cls.decorator_list:
        raise Unsupported("uses_fixtures", f"{class_name} sets tests up")
    if any(
        not ("TestCase" in ast.unparse(base) or ast.unparse(base) == "object") for base in cls.bases
    ):
        raise Unsupported("uses_test_state", f"{class_name} inherits tests or state")


def _check_references(references: References, targets: frozenset[Symbol]) -> None:
    if references.problems:
        reason, detail = references.problems[0]
        raise Unsupported(reason, detail)
    if not targets:
        raise Unsupported("no_source_calls", "calls no function of the repository")
    for symbol in sorted(targets, key=lambda s: (s.module, s.name)):
        if symbol.kind == "class":
            raise Unsupported("uses_class", f"{symbol.module}.{symbol.name} makes objects")
        if symbol.kind != "function":
            raise Unsupported("module_state", f"uses {symbol.module}.{symbol.name}")
        opaque = returned(references.codebase, symbol.module, symbol.name)
        if opaque is not None:
            raise Unsupported("opaque_value", f"calls {opaque.detail(symbol.name)}")


def _rendered(
    references: References, statement: ast.stmt, wanted: set[str]
) -> list[tuple[frozenset[str], str]]:
    """A needed test-module statement as the sandbox's tests will hold it, with the names it
    binds there; of an import, only the wanted names the sandbox can offer."""
    if not isinstance(statement, ast.Import | ast.ImportFrom):
        rewritten = ast.unparse(references.rewrite(statement))
        return [(frozenset(bound_names(statement)), rewritten)]
    rendered = []
    for alias in statement.names:
        bound = alias.asname or alias.name.split(".")[0]
        binding = references.module.bindings.get(bound)
        if bound not in wanted or binding is None:
            continue
        text = references.import_text(statement, alias, binding)
        if text is not None:
            rendered.append((frozenset({bound}), text))
    return rendered

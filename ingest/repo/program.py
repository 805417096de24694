"""A target function as a standalone program: the context it needs, then the function last.

The sandbox runs a candidate with the system `python3` and nothing else, so a program may use
the standard library only. Helpers a function imports from elsewhere in the repository are
inlined (their own dependencies too); anything third-party rejects the task. The target is
moved to the end so that the prompt — context plus the target's signature and docstring — is
a prefix of the reference, as in HumanEval, and `prompt + "    pass"` is a trivial solution
that QA can run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeGuard

from ingest.framework import Rejected
from ingest.repo.codebase import Codebase, Symbol, is_stdlib
from ingest.repo.files import PythonFile
from ingest.repo.names import (
    DEFINITIONS,
    bound_names,
    closure,
    import_time_names,
    is_docstring,
    used_names,
)
from ingest.repo.values import returned

MAX_INLINE_DEPTH = 6


@dataclass(frozen=True)
class Program:
    context: str  # everything but the target
    stub: str  # the target's decorators, signature and docstring
    target: str  # the target's full source

    @property
    def prompt(self) -> str:
        return _join(self.context, self.stub)

    @property
    def reference(self) -> str:
        return _join(self.context, self.target)


_Part = tuple[str, str]  # a statement's source, and its layout kind: def, import, doc, other


@dataclass
class _Pieces:
    """Statement texts gathered for one program, by where they go."""

    future: list[_Part] = field(default_factory=list)
    imports: list[_Part] = field(default_factory=list)  # all at the top: modules share them
    inlined: list[_Part] = field(default_factory=list)
    own: list[_Part] = field(default_factory=list)
    binders: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (module, meaning)
    seen: set[tuple[str, str]] = field(default_factory=set)  # (module, name) inlined
    target: tuple[str, str] = ("", "")  # the function the program is for


def target_function(source: PythonFile, name: str) -> ast.FunctionDef:
    """The module-level function `name`; Rejected when the module has no such plain function."""
    bindings = [s for s in source.tree.body if name in bound_names(s)]
    function = bindings[-1] if bindings else None
    if isinstance(function, ast.AsyncFunctionDef):
        raise Rejected("async_function", f"{name} is async; the sandbox calls plain functions")
    if not isinstance(function, ast.FunctionDef):
        raise Rejected("not_a_function", f"{name} is not a module-level function")
    if len(bindings) > 1:
        raise Rejected("rebound", f"{name} is bound more than once at module level")
    return function


def build_program(
    codebase: Codebase, module: str, name: str, extra: Iterable[Symbol] = ()
) -> Program:
    """The program around `module.name`; `extra` (other functions the tests call, of this
    module or others) is kept as context too. Raises Rejected for what cannot run standalone."""
    source = codebase.module(module)
    if source is None:
        raise Rejected("unreadable_module", module)
    function = target_function(source, name)
    check_returns(codebase, module, name)
    _check_body(function)
    pieces = _Pieces(target=(module, name))
    statements = [s for s in source.tree.body if s is not function]
    for symbol in sorted(extra, key=lambda s: (s.module, s.name)):
        if symbol.module != module:
            _inline(codebase, symbol.module, symbol.name, pieces, depth=1)
    own_extra = {symbol.name for symbol in extra if symbol.module == module}
    needed = (used_names(function) | own_extra) - {name}
    chosen = with_future(statements, closure(statements, needed))
    for statement in chosen:
        if name in import_time_names(statement):
            raise Rejected("used_at_import", f"{module} uses {name} while it is imported")
    _emit(codebase, module, source, chosen, pieces, pieces.own, depth=0)
    first = source.tree.body[0] if source.tree.body else None
    header = [(segment(source, first), "doc")] if first and is_docstring(first) else []
    context = _render([*header, *pieces.future, *pieces.imports, *pieces.inlined, *pieces.own])
    return Program(context, _stub(source, function), segment(source, function))


def check_returns(codebase: Codebase, module: str, name: str) -> None:
    """Rejected when what `module.name` gives back cannot cross the sandbox as a literal."""
    opaque = returned(codebase, module, name)
    if opaque is not None:
        raise Rejected(opaque.reason, opaque.detail(name))


def _render(parts: list[_Part]) -> str:
    """Statements laid out as PEP 8 has it: two blank lines around definitions, one after
    the docstring, the imports and multi-line statements, none between one-line ones."""
    text = ""
    previous: _Part | None = None
    for part in parts:
        if previous is not None:
            text += _separator(previous, part)
        text += part[0]
        previous = part
    return text


def _check_body(function: ast.FunctionDef) -> None:
    body = function.body[1:] if ast.get_docstring(function) is not None else function.body
    if ast.get_docstring(function) is None:
        raise Rejected("no_docstring", f"{function.name} has no docstring to say what it does")
    if all(_is_placeholder(statement) for statement in body):
        raise Rejected("trivial_body", f"{function.name} has no implementation")


def _is_placeholder(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Pass):
        return True
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
        return True  # `...` or a stray string
    if isinstance(statement, ast.Raise) and statement.exc is not None:
        raised = statement.exc.func if isinstance(statement.exc, ast.Call) else statement.exc
        return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"
    return False


def _emit(
    codebase: Codebase,
    module: str,
    source: PythonFile,
    chosen: list[ast.stmt],
    pieces: _Pieces,
    bucket: list[_Part],
    depth: int,
) -> None:
    """Add the chosen statements of one module to `bucket`, in their order. An import of
    in-repo names is replaced by the definitions it names (inlined first); every other
    import must be the standard library."""
    for statement in chosen:
        if isinstance(statement, ast.ImportFrom) and _is_in_repo(codebase, module, statement):
            _inline_from(codebase, module, statement, pieces, depth)
            continue
        if is_type_checking_block(statement):
            _emit_type_only(codebase, module, source, statement, pieces, bucket)
            continue
        for node in _imports_outside_guards(statement):
            _check_import(codebase, module, node)
        text = segment(source, statement)
        if _add(pieces, module, _meanings(codebase, module, statement, text)):
            target = _bucket(pieces, statement, bucket)
            target.append((text, _layout(statement)))


def with_future(statements: list[ast.stmt], indices: Iterable[int]) -> list[ast.stmt]:
    """The chosen statements, and the module's `from __future__` imports: they change how
    its code compiles (`annotations` leaves annotations unevaluated), no name it reads."""
    chosen = set(indices)
    return [s for index, s in enumerate(statements) if index in chosen or _is_future(s)]


def _is_future(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.ImportFrom) and statement.module == "__future__"


def is_type_checking_block(statement: ast.stmt) -> TypeGuard[ast.If]:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): code only a type checker runs."""
    if not isinstance(statement, ast.If):
        return False
    test = statement.test
    name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
    return name == "TYPE_CHECKING"


def _emit_type_only(
    codebase: Codebase,
    module: str,
    source: PythonFile,
    block: ast.If,
    pieces: _Pieces,
    bucket: list[_Part],
) -> None:
    """An `if TYPE_CHECKING:` block never runs, so its imports need not resolve: those of the
    standard library stay for the reader, the others go (annotations that name them stay
    unevaluated under the module's future import, as they were in the repository). Its
    `else:` runs, and is checked like any other code."""
    for node in [
        child for statement in block.orelse for child in _imports_outside_guards(statement)
    ]:
        _check_import(codebase, module, node)
    kept = [s for s in block.body if not _is_foreign_import(codebase, module, s)]
    if not kept and not block.orelse:
        return
    if len(kept) == len(block.body):
        text = segment(source, block)
    else:
        text = ast.unparse(ast.If(block.test, kept or [ast.Pass()], block.orelse))
    meanings: dict[str, str] = {}
    for statement in [*kept, *block.orelse]:
        meanings |= _meanings(codebase, module, statement, ast.unparse(statement))
    if _add(pieces, module, meanings):
        bucket.append((text, "other"))


def _is_foreign_import(codebase: Codebase, module: str, statement: ast.stmt) -> bool:
    """An import of the repository or a third party: what the sandbox cannot import."""
    if not isinstance(statement, ast.Import | ast.ImportFrom):
        return False
    try:
        _check_import(codebase, module, statement)
    except Rejected:
        return True
    return False


def _is_in_repo(codebase: Codebase, module: str, node: ast.ImportFrom) -> bool:
    return bool(node.level) or codebase.is_in_repo(codebase.absolute(module, node))


def _imports_outside_guards(statement: ast.stmt) -> list[ast.Import | ast.ImportFrom]:
    """Import nodes, except those in the body of a `try` (its handlers are the fallback:
    `try: from cStringIO import StringIO` / `except ImportError: from io import ...`)."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = [statement]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.Try) and node.handlers:
            todo.extend([*node.handlers, *node.orelse, *node.finalbody])
        else:
            todo.extend(ast.iter_child_nodes(node))
    return found


def _check_import(codebase: Codebase, module: str, node: ast.Import | ast.ImportFrom) -> None:
    """An import that stays as written: it must be the standard library."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        targets = [codebase.absolute(module, node)]
    for target in targets:
        if codebase.is_in_repo(target) or (isinstance(node, ast.ImportFrom) and node.level):
            raise Rejected("in_repo_import", f"{module} imports the module {target} itself")
        if not is_stdlib(target):
            raise Rejected("third_party_imports", f"{module} needs {target}")


def _inline_from(
    codebase: Codebase, module: str, node: ast.ImportFrom, pieces: _Pieces, depth: int
) -> None:
    """`from .helpers import slug as s`: inline `slug` (and what it needs), then `s = slug`."""
    origin = codebase.absolute(module, node)
    if depth >= MAX_INLINE_DEPTH or any(alias.name == "*" for alias in node.names):
        raise Rejected("in_repo_import", f"{module} imports * or too deeply from {origin}")
    for alias in node.names:
        symbol = codebase.resolve(origin, alias.name)
        if symbol is None or symbol.kind in ("module", "external"):
            raise Rejected("in_repo_import", f"{module} imports {origin}.{alias.name}")
        _inline(codebase, symbol.module, symbol.name, pieces, depth + 1)
        bound = alias.asname or alias.name
        if bound != symbol.name:
            text = f"{bound} = {symbol.name}"
            _bind(pieces, module, bound, f"{module}:{text}")
            pieces.inlined.append((text, "other"))


def _inline(codebase: Codebase, module: str, name: str, pieces: _Pieces, depth: int) -> None:
    """Put `module.name` and what it needs before the importing module's own code."""
    if (module, name) == pieces.target:  # the target comes last: nothing may import it
        raise Rejected("used_at_import", f"{module}.{name} is imported by its own context")
    if (module, name) in pieces.seen:
        return
    pieces.seen.add((module, name))
    source = codebase.module(module)
    if source is None:
        raise Rejected("in_repo_import", f"{module} cannot be read")
    statements = source.tree.body
    chosen = with_future(statements, closure(statements, {name}))
    _emit(codebase, module, source, chosen, pieces, pieces.inlined, depth)


def _add(pieces: _Pieces, module: str, meanings: dict[str, str]) -> bool:
    """Record what a statement binds; False when it binds nothing new (`import re` twice)."""
    known = {name: pieces.binders.get(name, ("", ""))[1] for name in meanings}
    if meanings and known == meanings:
        return False
    for name, meaning in meanings.items():
        _bind(pieces, module, name, meaning)
    return True


def _meanings(codebase: Codebase, module: str, statement: ast.stmt, text: str) -> dict[str, str]:
    """Each bound name with what it means: the thing imported, else the statement itself
    (two modules may both `from typing import Any`, but not both define `helper`)."""
    if isinstance(statement, ast.Import):
        bound = {alias.asname or alias.name.split(".")[0]: alias for alias in statement.names}
        return {
            name: f"import {alias.name if alias.asname else name}" for name, alias in bound.items()
        }
    if isinstance(statement, ast.ImportFrom):
        origin = codebase.absolute(module, statement)
        return {alias.asname or alias.name: f"{origin}.{alias.name}" for alias in statement.names}
    if _is_literal_assignment(statement):
        return dict.fromkeys(bound_names(statement), text)  # `TYPE_CHECKING = False` anywhere
    return dict.fromkeys(bound_names(statement), f"{module}:{text}")


def _is_literal_assignment(statement: ast.stmt) -> bool:
    if not isinstance(statement, ast.Assign) or not all(
        isinstance(target, ast.Name) for target in statement.targets
    ):
        return False
    try:
        ast.literal_eval(statement.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _bind(pieces: _Pieces, module: str, name: str, meaning: str) -> None:
    """A module may rebind its own names; two modules may not bind one name differently."""
    bound_by, known = pieces.binders.get(name, (module, meaning))
    if bound_by != module and known != meaning:
        raise Rejected("name_clash", f"{name} is defined differently in {bound_by} and {module}")
    pieces.binders[name] = (module, meaning)


def _separator(previous: _Part, part: _Part) -> str:
    if "def" in (previous[1], part[1]):
        return "\n\n\n"
    if previous[1] != part[1] or "\n" in part[0] or "\n" in previous[0]:
        return "\n\n"
    return "\n"


def _layout(statement: ast.stmt) -> str:
    if isinstance(statement, DEFINITIONS):
        return "def"
    return "import" if isinstance(statement, ast.Import | ast.ImportFrom) else "other"


def _bucket(pieces: _Pieces, statement: ast.stmt, default: list[_Part]) -> list[_Part]:
    if isinstance(statement, ast.ImportFrom) and statement.module == "__future__":
        return pieces.future
    return pieces.imports if isinstance(statement, ast.Import | ast.ImportFrom) else default


def segment(source: PythonFile, statement: ast.stmt) -> str:
    """A statement's source as written, decorators and comments inside it included."""
    decorators = getattr(statement, "decorator_list", [])
    start = min([statement.lineno, *(d.lineno for d in decorators)])
    end = statement.end_lineno or statement.lineno
    return "\n".join(source.lines[start - 1 : end])


def _stub(source: PythonFile, function: ast.FunctionDef) -> str:
    """Decorators, signature and docstring: what a model is given to write the body from."""
    docstring = function.body[0]
    end = docstring.end_lineno or docstring.lineno
    is_crowded = len(function.body) > 1 and function.body[1].lineno <= end
    if is_crowded or docstring.lineno == function.lineno:
        raise Rejected("unusual_layout", f"{function.name}'s docstring shares a line with code")
    start = min([function.lineno, *(d.lineno for d in function.decorator_list)])
    return "\n".join(source.lines[start - 1 : end])


def _join(context: str, tail: str) -> str:
    return f"{context}\n\n\n{tail}\n" if context else f"{tail}\n"

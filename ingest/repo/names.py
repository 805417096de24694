"""Which module-level statements a piece of code needs: names bound, names used, closures.

A task's program is the target function plus only the statements it depends on, so a prompt
carries the helpers and constants a model needs and not the rest of a 2,000-line module.
The analysis is by name and errs towards including: a local variable that shares a global's
name pulls the global in, which costs prompt length, never correctness. Import-time side
effects count too: `_irregular("person", "people")` mutates the `PLURALS` that `pluralize`
reads, so a bare call is kept when anything it reaches (through the functions it calls) is
needed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence

DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
IMPORTS = (ast.Import, ast.ImportFrom)


def bound_names(statement: ast.stmt) -> set[str]:
    """Names a module-level statement binds (or mutates in place: `X.append(...)`, `X[k] = v`)."""
    if isinstance(statement, DEFINITIONS):
        return {statement.name}
    if isinstance(statement, IMPORTS):
        return {
            (alias.asname or alias.name).split(".")[0]
            for alias in statement.names
            if alias.name != "*"
        }
    names: set[str] = set()
    todo: list[ast.AST] = [statement]
    while todo:
        node = todo.pop()
        if node is not statement and isinstance(node, DEFINITIONS + IMPORTS):
            names |= bound_names(node)  # inside `if`/`try`: `try: import x except: x = None`
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        if isinstance(node, ast.stmt):
            names.update(b for b in map(_base_name, _assigned(node)) if b is not None)
        todo.extend(ast.iter_child_nodes(node))
    return names


def _assigned(statement: ast.stmt) -> list[ast.expr]:
    if isinstance(statement, ast.Assign):
        return statement.targets
    if isinstance(statement, ast.AugAssign | ast.AnnAssign):
        return [statement.target]
    return []


def _base_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def used_names(node: ast.AST) -> set[str]:
    """Names the code reads from its enclosing (module) scope, approximately.

    In a function, a name that is assigned anywhere in it is local (as Python decides), and
    parameters are local; `global` names stay module-level.
    """
    loads: set[str] = set()
    locals_: set[str] = set()
    globals_: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            (loads if isinstance(child.ctx, ast.Load) else locals_).add(child.id)
        elif isinstance(child, ast.Global):
            globals_.update(child.names)
        elif child is not node:
            locals_.update(_local_binding(child))
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        return loads  # module-level code: its stores are the module's own names
    return loads - (locals_ - globals_)


def _local_binding(node: ast.AST) -> set[str]:
    """Names bound inside a function other than by assignment: parameters, nested
    definitions, local imports, `except ... as name`."""
    if isinstance(node, ast.arg):
        return {node.arg}
    if isinstance(node, DEFINITIONS):
        return {node.name}
    if isinstance(node, IMPORTS):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    if isinstance(node, ast.ExceptHandler) and node.name:
        return {node.name}
    return set()


def import_time_names(statement: ast.stmt) -> set[str]:
    """Names a statement reads while the module is being imported (not when called later)."""
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
        parts: list[ast.AST] = [*statement.decorator_list, *statement.args.defaults]
        parts += [default for default in statement.args.kw_defaults if default is not None]
        return set().union(*(used_names(part) for part in parts))
    if isinstance(statement, ast.ClassDef):
        parts = [*statement.decorator_list, *statement.bases, *statement.keywords]
        body = [item for item in statement.body if not isinstance(item, DEFINITIONS)]
        return set().union(*(used_names(part) for part in [*parts, *body]))
    return used_names(statement)


def is_main_guard(statement: ast.stmt) -> bool:
    """`if __name__ == "__main__":` — never run when the module is imported."""
    test = statement.test if isinstance(statement, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def closure(
    statements: Sequence[ast.stmt], needed: Iterable[str], *, effects: bool = True
) -> list[int]:
    """Indices (in order) of the module-level statements that `needed` names depend on,
    including (with `effects`) bare statements — calls, loops — whose import-time effects
    reach them."""
    binders: dict[str, list[int]] = {}
    for index, statement in enumerate(statements):
        for name in bound_names(statement):
            binders.setdefault(name, []).append(index)
    effectful = [i for i, statement in enumerate(statements) if effects and _is_effect(statement)]
    wanted = set(needed)
    chosen: set[int] = set()
    while True:
        before = len(chosen)
        for name in list(wanted):
            chosen.update(binders.get(name, ()))
        for index in effectful:
            if (
                index not in chosen
                and _reaches(statements, index, binders) & wanted & binders.keys()
            ):
                chosen.add(index)
        for index in chosen:
            wanted |= used_names(statements[index])
        if len(chosen) == before:
            return sorted(chosen)


def _is_effect(statement: ast.stmt) -> bool:
    """A statement run for what it does, not (only) for the plain names it binds."""
    if isinstance(statement, DEFINITIONS + IMPORTS) or is_docstring(statement):
        return False
    if isinstance(statement, ast.Assign | ast.AugAssign | ast.AnnAssign):
        return not all(isinstance(target, ast.Name) for target in _assigned(statement))
    return not is_main_guard(statement)


def _reaches(statements: Sequence[ast.stmt], index: int, binders: dict[str, list[int]]) -> set[str]:
    """Every module-level name a statement touches, directly or through what it calls."""
    seen: set[str] = set()
    todo = used_names(statements[index]) | bound_names(statements[index])
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for binder in binders.get(name, ()):
            if isinstance(statements[binder], DEFINITIONS):
                todo |= used_names(statements[binder]) - seen
    return seen

"""Turn a repository's test into a plain `def test_x():` the sandbox's runner can collect.

The runner has no pytest (a shim gives `pytest.raises` and nothing else), collects top-level
`test*` functions only and calls them without arguments. So `@pytest.mark.parametrize`
becomes a loop over the same values, a unittest method becomes a function with its
`self.assertX(...)` calls as plain asserts, and anything that needs pytest's machinery —
fixtures, skip/xfail marks, other decorators, test state on `self` — is Unsupported, with the
reason the ingest run counts.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from dataclasses import dataclass

SKIP_MARKS = frozenset({"skip", "skipif", "xfail"})
COMPARISONS: dict[str, Callable[[], ast.cmpop]] = {
    "assertEqual": ast.Eq, "assertEquals": ast.Eq, "assertListEqual": ast.Eq,
    "assertTupleEqual": ast.Eq, "assertDictEqual": ast.Eq, "assertSetEqual": ast.Eq,
    "assertSequenceEqual": ast.Eq, "assertMultiLineEqual": ast.Eq,
    "assertNotEqual": ast.NotEq, "assertIs": ast.Is, "assertIsNot": ast.IsNot,
    "assertIn": ast.In, "assertNotIn": ast.NotIn, "assertGreater": ast.Gt,
    "assertGreaterEqual": ast.GtE, "assertLess": ast.Lt, "assertLessEqual": ast.LtE,
}  # fmt: skip
SETUP_METHODS = frozenset(
    {
        "setUp", "tearDown", "setUpClass", "tearDownClass", "setup_method", "teardown_method",
        "setup_class", "teardown_class", "setup", "teardown", "asyncSetUp", "asyncTearDown",
    }
)  # fmt: skip


class Unsupported(Exception):
    """A test the sandbox cannot run as it is; `reason` is the slug the run counts."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Parametrize:
    names: list[str]
    is_single: bool  # one name given as a string: each value is the argument itself
    values: ast.expr


def plain_test(
    function: ast.FunctionDef,
    *,
    name: str,
    pytest_paths: Callable[[ast.expr], str | None],
    is_method: bool = False,
) -> ast.FunctionDef:
    """A copy of `function` named `name`, with no parameters and no decorators, that runs
    every parametrized case in turn. `pytest_paths` says what a node is inside pytest
    (`pytest.mark.parametrize` -> "mark.parametrize"), or None for anything else."""
    function = copy.deepcopy(function)
    cases = [_decorator(d, pytest_paths) for d in function.decorator_list]
    parametrized = [case for case in cases if case is not None]
    params = [arg.arg for arg in [*function.args.posonlyargs, *function.args.args]]
    if is_method:
        if not params:
            raise Unsupported("uses_test_state", f"{function.name} takes no self")
        function.body = _unittest_asserts(function.body, params.pop(0))
    with_defaults = set(params[len(params) - len(function.args.defaults) :])
    covered = {arg for case in parametrized for arg in case.names}
    fixtures = [p for p in params if p not in covered and p not in with_defaults]
    fixtures += [arg.arg for arg in function.args.kwonlyargs if arg.arg not in covered]
    if fixtures or function.args.vararg or function.args.kwarg:
        raise Unsupported("uses_fixtures", f"{function.name} asks for {', '.join(fixtures)}")
    for case in reversed(parametrized):
        target = _loop_target(case)
        function.body = [ast.For(target=target, iter=case.values, body=function.body, orelse=[])]
    function.name = name
    function.decorator_list = []
    function.args = ast.arguments(
        posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
        defaults=[],
    )  # fmt: skip
    function.returns = None
    return ast.fix_missing_locations(function)


def _decorator(
    node: ast.expr, pytest_paths: Callable[[ast.expr], str | None]
) -> Parametrize | None:
    """A parametrize mark as data; None for a mark that changes nothing here."""
    call = node if isinstance(node, ast.Call) else None
    path = pytest_paths(call.func if call is not None else node)
    shown = ast.unparse(node)
    if path is None or not path.startswith("mark."):
        raise Unsupported("decorated_test", f"@{shown} is not a pytest mark")
    mark = path.removeprefix("mark.")
    if mark in SKIP_MARKS:
        raise Unsupported("skipped_test", f"@{shown}")
    if mark == "usefixtures":
        raise Unsupported("uses_fixtures", f"@{shown}")
    if mark != "parametrize":
        return None  # slow, filterwarnings, timeout...: nothing to run differently
    given = {keyword.arg: keyword.value for keyword in call.keywords} if call else {}
    argnames = call.args[0] if call and call.args else given.get("argnames")
    argvalues = call.args[1] if call and len(call.args) > 1 else given.get("argvalues")
    if argnames is None or argvalues is None:
        raise Unsupported("dynamic_parametrize", f"@{shown}")
    if "indirect" in given:
        raise Unsupported("uses_fixtures", f"@{shown} is indirect")
    names, is_single = _argnames(argnames, shown)
    return Parametrize(names, is_single, _argvalues(argvalues, is_single, pytest_paths))


def _argnames(node: ast.expr, shown: str) -> tuple[list[str], bool]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        names = [part.strip() for part in node.value.split(",") if part.strip()]
        return names, len(names) == 1
    if isinstance(node, ast.Tuple | ast.List) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return [str(e.value) for e in node.elts if isinstance(e, ast.Constant)], False
    raise Unsupported("dynamic_parametrize", f"argument names of @{shown} are computed")


def _argvalues(
    node: ast.expr, is_single: bool, pytest_paths: Callable[[ast.expr], str | None]
) -> ast.expr:
    """The values as an expression to loop over; `pytest.param(...)` entries unwrapped, and
    those marked skip or xfail left out."""
    if not isinstance(node, ast.List | ast.Tuple):
        return node
    values: list[ast.expr] = []
    for element in node.elts:
        is_param = isinstance(element, ast.Call) and pytest_paths(element.func) == "param"
        if not isinstance(element, ast.Call) or not is_param:
            values.append(element)
            continue
        marks = [k.value for k in element.keywords if k.arg == "marks"]
        if any(_mentions_skip(mark, pytest_paths) for mark in marks):
            continue
        if is_single and len(element.args) == 1:
            values.append(element.args[0])
        else:
            values.append(ast.Tuple(elts=list(element.args), ctx=ast.Load()))
    return ast.List(elts=values, ctx=ast.Load())


def _mentions_skip(node: ast.expr, pytest_paths: Callable[[ast.expr], str | None]) -> bool:
    return any(
        (pytest_paths(child) or "").removeprefix("mark.") in SKIP_MARKS
        for child in ast.walk(node)
        if isinstance(child, ast.expr)
    )


def _loop_target(case: Parametrize) -> ast.expr:
    if case.is_single:
        return ast.Name(id=case.names[0], ctx=ast.Store())
    names: list[ast.expr] = [ast.Name(id=name, ctx=ast.Store()) for name in case.names]
    return ast.Tuple(elts=names, ctx=ast.Store())


def _unittest_asserts(body: list[ast.stmt], self_name: str) -> list[ast.stmt]:
    """`self.assertEqual(a, b)` -> `assert a == b` and the like; any other use of `self` is
    state the test needs from its class."""
    rewritten = [_UnittestAsserts(self_name).visit(statement) for statement in body]
    module = ast.Module(body=rewritten, type_ignores=[])
    for node in ast.walk(module):
        if isinstance(node, ast.Name) and node.id == self_name:
            raise Unsupported("uses_test_state", f"uses {self_name} beyond assertions")
    return rewritten


class _UnittestAsserts(ast.NodeTransformer):
    def __init__(self, self_name: str) -> None:
        self.self_name = self_name

    def _method(self, node: ast.expr) -> str | None:
        """`assertEqual` for `self.assertEqual`; None for anything else."""
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == self.self_name
        ):
            return node.attr
        return None

    def visit_Expr(self, node: ast.Expr) -> ast.stmt:
        call = node.value
        method = self._method(call.func) if isinstance(call, ast.Call) else None
        if method is None or not isinstance(call, ast.Call):
            return node
        replaced = assert_statement(method, call)
        return ast.copy_location(replaced, node) if replaced is not None else node

    def visit_With(self, node: ast.With) -> ast.With:
        self.generic_visit(node)
        for item in node.items:
            call = item.context_expr
            if isinstance(call, ast.Call) and self._method(call.func) == "assertRaises":
                if item.optional_vars is not None or len(call.args) != 1 or call.keywords:
                    raise Unsupported("pytest_feature", "assertRaises as a context with a name")
                item.context_expr = _raises(call.args[0])
        return node


def assert_statement(method: str, call: ast.Call) -> ast.stmt | None:
    """The plain statement a unittest assertion means; None for one it does not know."""
    args, kwargs = call.args, {k.arg: k.value for k in call.keywords}
    message = kwargs.pop("msg", None)
    if method in COMPARISONS and len(args) in (2, 3) and not kwargs:
        message = args[2] if len(args) == 3 else message
        compare = ast.Compare(left=args[0], ops=[COMPARISONS[method]()], comparators=[args[1]])
        return ast.Assert(test=compare, msg=message)
    if method in _UNARY and len(args) in (1, 2) and not kwargs:
        message = args[1] if len(args) == 2 else message
        return ast.Assert(test=_UNARY[method](args[0]), msg=message)
    if method in ("assertIsInstance", "assertNotIsInstance") and len(args) == 2 and not kwargs:
        test: ast.expr = ast.Call(ast.Name("isinstance", ast.Load()), list(args), [])
        if method == "assertNotIsInstance":
            test = ast.UnaryOp(ast.Not(), test)
        return ast.Assert(test=test, msg=message)
    if method == "assertRaises" and len(args) >= 2:
        body = ast.Expr(ast.Call(args[1], list(args[2:]), list(call.keywords)))
        return ast.With(items=[ast.withitem(_raises(args[0]))], body=[body])
    if method == "fail":
        raised = ast.Call(ast.Name("AssertionError", ast.Load()), list(args), [])
        return ast.Raise(exc=raised, cause=None)
    if method.startswith("assert") or method.startswith("fail"):
        raise Unsupported("unsupported_assertion", f"self.{method}")
    return None


def _raises(expected: ast.expr) -> ast.expr:
    return ast.Call(
        ast.Attribute(ast.Name("pytest", ast.Load()), "raises", ast.Load()), [expected], []
    )


def _is_none(value: ast.expr, op: ast.cmpop) -> ast.expr:
    return ast.Compare(left=value, ops=[op], comparators=[ast.Constant(None)])


_UNARY: dict[str, Callable[[ast.expr], ast.expr]] = {
    "assertTrue": lambda value: value,
    "assert_": lambda value: value,
    "assertFalse": lambda value: ast.UnaryOp(ast.Not(), value),
    "assertIsNone": lambda value: _is_none(value, ast.Is()),
    "assertIsNotNone": lambda value: _is_none(value, ast.IsNot()),
}

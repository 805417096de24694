"""BFCL's multi-turn environments: the classes' source, their tools, ground-truth calls.

BFCL (the `bfcl-eval` package, Apache-2.0) ships each environment class as a Python module
(`eval_checker/multi_turn_eval/func_source_code/gorilla_file_system.py`, ...) and its tool
docs as JSON lines (`data/multi_turn_func_doc/gorilla_file_system.json`). An `EnvironmentCatalog`
reads both from one directory: the `.py` files from it, the `.json` docs from it or, in the
installed package's layout, from `<package>/data/multi_turn_func_doc/`.

A task's environment source is one module that runs each BFCL module it needs as a module of
its own, under its BFCL name (`sys.modules`), so the modules' imports between them resolve and
their module-level names (several define `DEFAULT_STATE`) stay apart. Of `long_context.py`
(190 kB of padding data) only the names the task's modules import are kept.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from flywheel.errors import InvalidInput
from ingest.framework import Rejected

PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
# BFCL's constants.executable_backend_config, for the multi-turn suite's classes: the module
# (and the function-doc file) of each class.
CLASS_MODULES = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
STATELESS_CLASSES = {"MathAPI"}  # BFCL loads no scenario into these
ENVIRONMENTS_HELP = (
    "give --environments DIR: the directory of BFCL's environment classes "
    "(bfcl_eval/eval_checker/multi_turn_eval/func_source_code)"
)

LOADER = """\
# BFCL's environment classes (bfcl-eval, Apache-2.0, (c) the Gorilla/BFCL authors, UC Berkeley),
# bundled by `flywheel ingest tasks --format bfcl`: each BFCL module runs as its own module.
import sys as _sys
import types as _types


def _bfcl_module(name, source):
    module = _types.ModuleType(name)
    _sys.modules[name] = module
    exec(compile(source, name.rsplit(".", 1)[-1] + ".py", "exec"), module.__dict__)
    return module
"""
LONG_CONTEXT = '''

def _with_long_context(cls):
    """BFCL's long-context category loads every scenario with long_context=True."""
    load = cls._load_scenario

    def _load_scenario(self, scenario, long_context=True):
        return load(self, scenario, long_context=long_context)

    cls._load_scenario = _load_scenario
    return cls
'''


def default_environments_dir() -> Path | None:
    """The installed `bfcl_eval` package's func_source_code directory, if there is one."""
    spec = importlib.util.find_spec("bfcl_eval")  # finds it without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(next(iter(spec.submodule_search_locations)))
    return directory / "eval_checker" / "multi_turn_eval" / "func_source_code"


class EnvironmentCatalog:
    """The environment classes of one BFCL directory (read once each)."""

    def __init__(self, directory: Path) -> None:
        if not directory.is_dir():
            raise InvalidInput(f"--environments {directory}: no such directory")
        self.directory = directory
        self._sources: dict[tuple[tuple[str, ...], bool], str] = {}
        self._signatures: dict[tuple[str, ...], dict[str, list[str]]] = {}

    def fingerprint(self) -> str:
        """sha256 of the files the catalog can read (their names and bytes)."""
        digest = hashlib.sha256()
        for path in sorted(self._doc_files() + list(self.directory.glob("*.py"))):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return digest.hexdigest()

    def _doc_files(self) -> list[Path]:
        return [path for name in CLASS_MODULES.values() if (path := self._doc_path(name))]

    def _doc_path(self, module: str) -> Path | None:
        folders = [self.directory]
        if len(self.directory.resolve().parents) > 2:  # the installed package's layout
            folders.append(self.directory.resolve().parents[2] / "data" / "multi_turn_func_doc")
        for folder in folders:
            if (path := folder / f"{module}.json").is_file():
                return path
        return None

    def module_source(self, module: str) -> str:
        return _read_text(self.directory / f"{module}.py")

    def func_docs(self, class_name: str) -> list[dict[str, Any]]:
        path = self._doc_path(CLASS_MODULES[class_name])
        if path is None:
            raise Rejected("missing_environment", f"no function docs for {class_name}")
        return _read_docs(path)

    def source(self, classes: Sequence[str], *, long_context: bool) -> str:
        """One module defining `classes` (BFCL's modules bundled, see the module doc)."""
        key = (tuple(classes), long_context)
        if key not in self._sources:
            self._sources[key] = self._bundle(classes, long_context=long_context)
        return self._sources[key]

    def _bundle(self, classes: Sequence[str], *, long_context: bool) -> str:
        modules = {name: self.module_source(CLASS_MODULES[name]) for name in classes}
        helpers = _helper_modules(self, modules.values())
        parts = [LOADER + (LONG_CONTEXT if long_context else "")]
        for name, source in helpers.items():
            parts.append(f"_bfcl_module({f'{PACKAGE}.{name}'!r}, {source!r})")
        for class_name, source in modules.items():
            module = f"{PACKAGE}.{CLASS_MODULES[class_name]}"
            line = f"{class_name} = _bfcl_module({module!r}, {source!r}).{class_name}"
            if long_context and _has_method(source, class_name, "_load_scenario"):
                line += f"\n{class_name} = _with_long_context({class_name})"
            parts.append(line)
        return "\n\n".join(parts) + "\n"

    def signatures(self, classes: Sequence[str]) -> dict[str, list[str]]:
        """Each public method's positional parameter names (self left out); the first class
        in `classes` that has a method owns its name."""
        if (key := tuple(classes)) not in self._signatures:
            owned: dict[str, list[str]] = {}
            for class_name in classes:
                methods = _methods(self.module_source(CLASS_MODULES[class_name]), class_name)
                for name, parameters in methods.items():
                    owned.setdefault(name, parameters)
            self._signatures[key] = owned
        return self._signatures[key]


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise Rejected("missing_environment", f"no {path.name} in the environments directory")
    return path.read_text(encoding="utf-8")


@cache
def _read_docs(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:  # BFCL writes these as JSON lines; a plain JSON list is read too
        docs = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError:
        docs = json.loads(text)
    if len(docs) == 1 and isinstance(docs[0], list):
        docs = docs[0]
    return list(docs)


def _helper_modules(catalog: EnvironmentCatalog, sources: Any) -> dict[str, str]:
    """The BFCL modules `sources` import (`from bfcl_eval...func_source_code.X import a, b`),
    each cut down to the names imported from it, in first-import order."""
    wanted: dict[str, set[str]] = {}
    for source in sources:
        for node in ast.parse(source).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + "."):
                names = wanted.setdefault(node.module.rsplit(".", 1)[-1], set())  # type: ignore[union-attr]
                names.update(alias.name for alias in node.names)
    return {name: _only(catalog.module_source(name), names) for name, names in wanted.items()}


def _only(source: str, names: set[str]) -> str:
    """The module's imports and the top-level assignments of `names`, in their order."""
    kept = []
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        is_wanted = any(isinstance(target, ast.Name) and target.id in names for target in targets)
        if is_wanted or isinstance(node, ast.Import | ast.ImportFrom):
            kept.append(ast.get_source_segment(source, node) or "")
    return "\n".join(kept) + "\n"


def _class_node(source: str, class_name: str) -> ast.ClassDef:
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return node
    raise Rejected("missing_environment", f"the source defines no class {class_name}")


def _methods(source: str, class_name: str) -> dict[str, list[str]]:
    methods = {}
    for node in _class_node(source, class_name).body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            positional = [arg.arg for arg in node.args.posonlyargs + node.args.args]
            methods[node.name] = positional[1:]
    return methods


def _has_method(source: str, class_name: str, method: str) -> bool:
    node = _class_node(source, class_name)
    return any(isinstance(item, ast.FunctionDef) and item.name == method for item in node.body)


def parse_call(text: str, signatures: Mapping[str, list[str]]) -> dict[str, Any]:
    """One of BFCL's ground-truth call strings as {"name", "arguments"}: positional arguments
    take their parameter's name from the method's signature, values must be literals.

    >>> parse_call("sort('final_report.pdf')", {"sort": ["file_name"]})
    {'name': 'sort', 'arguments': {'file_name': 'final_report.pdf'}}
    >>> parse_call("mean(numbers=[1, 2.5])", {"mean": ["numbers"]})
    {'name': 'mean', 'arguments': {'numbers': [1, 2.5]}}
    """
    try:
        call = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as error:
        raise Rejected("unparsable_ground_truth", f"{text!r}: {error.msg}") from error
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise Rejected("unparsable_ground_truth", f"{text!r} is not a call of a tool")
    name = call.func.id
    if name not in signatures:
        raise Rejected("ground_truth_unknown_tool", f"{text!r}: no environment method {name}")
    return {"name": name, "arguments": _arguments(call, signatures[name], text)}


def _arguments(call: ast.Call, parameters: list[str], text: str) -> dict[str, Any]:
    if len(call.args) > len(parameters) or any(isinstance(a, ast.Starred) for a in call.args):
        raise Rejected("unparsable_ground_truth", f"{text!r}: too many positional arguments")
    pairs = list(zip(parameters, call.args, strict=False))
    for keyword in call.keywords:
        if keyword.arg is None:
            raise Rejected("unparsable_ground_truth", f"{text!r}: **arguments")
        pairs.append((keyword.arg, keyword.value))
    if len({name for name, _ in pairs}) < len(pairs):
        raise Rejected("unparsable_ground_truth", f"{text!r}: an argument given twice")
    try:
        return {name: _json_value(ast.literal_eval(node)) for name, node in pairs}
    except ValueError as error:
        raise Rejected("unparsable_ground_truth", f"{text!r}: not a literal") from error


def _json_value(value: Any) -> Any:
    """A literal as a JSON value (tuples become lists); anything else is not one."""
    if isinstance(value, tuple | list):
        return [_json_value(item) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _json_value(item) for key, item in value.items()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise ValueError(f"{type(value).__name__} is not a JSON value")

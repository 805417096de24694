"""A command group whose built-in commands load when they are first asked for: `flywheel
tenants list` imports `flywheel.cli.admin` and builds its commands only, not every command
module and every command's parameters (a tenth of a light command's start-up). The overview
(`flywheel --help`) still loads them all, to show their help; so do the tests that walk every
command (`group.commands.items()`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, ClassVar

import typer
from typer import _click  # typer vendors click; its Command is the commands' base
from typer.core import TyperGroup


@dataclass(frozen=True)
class Lazy:
    """Where a built-in command lives: `attribute` of `flywheel.cli.<module>`, a function
    (a command) or a `typer.Typer` (a group of commands)."""

    module: str
    attribute: str
    is_group: bool = False

    def load(self, name: str) -> _click.Command:
        found = getattr(importlib.import_module(f"flywheel.cli.{self.module}"), self.attribute)
        if self.is_group:
            group = typer.main.get_group(found)
            group.name = name
            return group
        single = typer.Typer(add_completion=False)
        single.command(name)(found)
        return typer.main.get_command(single)


class LazyCommands(MutableMapping[str, _click.Command]):
    """A group's commands by name: the built-in ones built on first use, the others (plugins)
    as given. Listed as typer lists them: commands, then groups, built-in ones first."""

    def __init__(self, lazy: Mapping[str, Lazy], loaded: Mapping[str, _click.Command]) -> None:
        self._lazy = dict(lazy)
        self._loaded = dict(loaded)

    def __getitem__(self, name: str) -> _click.Command:
        if name not in self._loaded:
            self._loaded[name] = self._lazy[name].load(name)  # KeyError: no such command
        return self._loaded[name]

    def __setitem__(self, name: str, command: _click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self._lazy and name not in self._loaded:
            raise KeyError(name)
        self._lazy.pop(name, None)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        others = {name: command for name, command in self._loaded.items() if name not in self._lazy}
        for is_group in (False, True):
            yield from (name for name, lazy in self._lazy.items() if lazy.is_group == is_group)
            yield from (n for n, c in others.items() if isinstance(c, TyperGroup) == is_group)

    def __len__(self) -> int:
        return len(self._lazy.keys() | self._loaded.keys())


class LazyGroup(TyperGroup):
    """A TyperGroup whose `lazy` commands (set by a subclass) load on first use."""

    lazy: ClassVar[Mapping[str, Lazy]] = {}

    def __init__(self, **options: Any) -> None:
        options["commands"] = LazyCommands(self.lazy, options.get("commands") or {})
        super().__init__(**options)

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return list(self.commands)  # the names: TyperGroup's would build every command

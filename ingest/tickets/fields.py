"""Reading one record of a vendor export: typed access whose errors name the record and the
field ("ticket 4711: comments[2].public must be true or false, not "yes""), so a malformed or
mislabelled export fails with a sentence instead of a KeyError."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flywheel.errors import InvalidInput


class Fields:
    """A JSON object from an export. Missing keys and nulls read as absent."""

    __slots__ = ("_data", "where")

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, dict):
            raise InvalidInput(f"{where} must be a JSON object, not {_json_type(data)}")
        self._data: dict[str, Any] = data
        self.where = where

    def raw(self, key: str) -> object:
        return self._data.get(key)

    def text(self, key: str) -> str:
        """A string field; "" when absent."""
        value = self._data.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self._error(key, "must be a string", value)
        return value

    def ident(self, key: str) -> str:
        """A required id, number or string."""
        value = self._data.get(key)
        if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
            raise self._error(key, "must be an id (a number or a string)", value)
        return str(value)

    def optional_ident(self, key: str) -> str | None:
        return None if self._data.get(key) is None else self.ident(key)

    def flag(self, key: str, *, default: bool) -> bool:
        value = self._data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._error(key, "must be true or false", value)
        return value

    def number(self, key: str) -> int | None:
        value = self._data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._error(key, "must be a whole number", value)
        return value

    def time(self, key: str) -> datetime | None:
        """An ISO 8601 timestamp ("2024-03-04T09:15:22Z", "...22.000+0000")."""
        value = self.text(key)
        if not value:
            return None
        try:
            moment = datetime.fromisoformat(value)
        except ValueError as error:
            raise self._error(key, "must be an ISO 8601 timestamp", value) from error
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)

    def obj(self, key: str) -> Fields | None:
        value = self._data.get(key)
        return None if value is None else Fields(value, f"{self.where}.{key}")

    def objects(self, key: str) -> list[Fields]:
        """A list of objects; [] when absent."""
        return [Fields(item, f"{self.where}.{key}[{index}]") for index, item in self._list(key)]

    def strings(self, key: str) -> list[str]:
        items = self._list(key)
        for index, item in items:
            if not isinstance(item, str):
                raise self._error(f"{key}[{index}]", "must be a string", item)
        return [item for _, item in items]

    def _list(self, key: str) -> list[tuple[int, Any]]:
        value = self._data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self._error(key, "must be a list", value)
        return list(enumerate(value))

    def _error(self, key: str, must: str, value: object) -> InvalidInput:
        shown = repr(value) if isinstance(value, str | int | float) else _json_type(value)
        return InvalidInput(f"{self.where}.{key} {must}, not {shown[:80]}")


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")

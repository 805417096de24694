"""The MLflow model registry behind a small protocol: what Flywheel needs of it, no more.

One registered model per domain (`<tenant>.<domain>`), adapter versions created from run
artifacts (`runs:/<run id>/adapter`: `create_model_version` works on a plain artifact
directory where `register_model` does not), and aliases — `champion`, `challenger` — never the
deprecated stages. Any failure to reach or use MLflow is a `RegistryUnavailable`, raised before
Flywheel records anything, so an alias is never half-moved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from flywheel.errors import RegistryUnavailable

T = TypeVar("T")


class Registry(Protocol):
    def create_version(
        self, name: str, source: str, run_id: str | None, tags: dict[str, str]
    ) -> str:
        """Register `source` as a new version of `name` (created if new); its version."""

    def set_alias(self, name: str, alias: str, version: str) -> None: ...

    def delete_alias(self, name: str, alias: str) -> None: ...

    def alias_version(self, name: str, alias: str) -> str | None: ...

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None: ...


class MlflowRegistry:
    """`Registry` on an MLflow tracking server or store URI."""

    def __init__(self, tracking_uri: str) -> None:
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)

    def create_version(
        self, name: str, source: str, run_id: str | None, tags: dict[str, str]
    ) -> str:
        def create() -> str:
            if not self._exists(name):
                self.client.create_registered_model(name)
            found = self.client.create_model_version(name, source=source, run_id=run_id, tags=tags)
            return str(found.version)

        return self._call(f"register a version of {name}", create)

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self._call(
            f"move {name}@{alias}",
            lambda: self.client.set_registered_model_alias(name, alias, version),
        )

    def delete_alias(self, name: str, alias: str) -> None:
        self._call(
            f"remove {name}@{alias}", lambda: self.client.delete_registered_model_alias(name, alias)
        )

    def alias_version(self, name: str, alias: str) -> str | None:
        from mlflow.exceptions import MlflowException

        def read() -> str | None:
            try:
                return str(self.client.get_model_version_by_alias(name, alias).version)
            except MlflowException as error:
                if error.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    return None
                raise

        return self._call(f"read {name}@{alias}", read)

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self._call(
            f"tag {name} v{version}",
            lambda: self.client.set_model_version_tag(name, version, key, value),
        )

    def _exists(self, name: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(name)
        except MlflowException as error:
            if error.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise
        return True

    def _call(self, what: str, action: Callable[[], T]) -> T:
        try:
            return action()
        except Exception as error:  # every MLflow or network failure means the same to callers
            first = (
                str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            )
            raise RegistryUnavailable(
                f"MLflow at {self.tracking_uri} could not {what}: {first[:300]}"
            ) from error

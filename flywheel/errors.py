"""Domain errors, each with a stable `code`. `api/errors.py` maps codes to HTTP statuses."""

from __future__ import annotations

from typing import Any


class FlywheelError(Exception):
    """Base of every error Flywheel raises on purpose."""

    code = "error"

    def __init__(self, message: str, *, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class InvalidInput(FlywheelError):
    code = "invalid_input"


class NotFound(FlywheelError):
    code = "not_found"


class Conflict(FlywheelError):
    code = "conflict"


class InvalidState(FlywheelError):
    code = "invalid_state"


class Unauthenticated(FlywheelError):
    code = "unauthenticated"


class Forbidden(FlywheelError):
    code = "forbidden"


class RateLimited(FlywheelError):
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SandboxUnavailable(FlywheelError):
    code = "sandbox_unavailable"


class EnvironmentFailed(FlywheelError):
    """An environment episode ended before its end (its source did not load, a call ran past
    its wall clock, it overran its CPU or memory budget, it exited) or its ground truth does
    not run; the message says why. A trainer scores such an episode 0."""

    code = "environment_failed"


class RegistryUnavailable(FlywheelError):
    """MLflow could not be reached or refused a registry call; nothing was moved."""

    code = "registry_unavailable"

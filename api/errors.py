"""Domain error codes -> HTTP statuses, in one table; every error body is the same shape."""

from __future__ import annotations

import sys
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from limits.errors import StorageError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException

from flywheel.errors import (
    Conflict,
    FlywheelError,
    Forbidden,
    InvalidInput,
    InvalidState,
    NotFound,
    RateLimited,
    RegistryUnavailable,
    SandboxUnavailable,
    Unauthenticated,
)

STATUS_BY_CODE = {
    InvalidInput.code: 422,
    NotFound.code: 404,
    Conflict.code: 409,
    InvalidState.code: 409,
    Unauthenticated.code: 401,
    Forbidden.code: 403,
    RateLimited.code: 429,
    SandboxUnavailable.code: 503,
    RegistryUnavailable.code: 503,
}

# Python refuses to parse longer integers (sys.get_int_max_str_digits(), 4,300 by default).
MAX_INT_DIGITS = sys.get_int_max_str_digits()

CODE_BY_HTTP_STATUS = {
    400: "bad_request",
    401: Unauthenticated.code,
    403: Forbidden.code,
    404: NotFound.code,
    405: "method_not_allowed",
    409: Conflict.code,
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: InvalidInput.code,
    429: RateLimited.code,
}


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    details: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        error["details"] = details
    return JSONResponse({"error": error}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(FlywheelError, _flywheel_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    for unreachable in SHARED_STORE_ERRORS:
        app.add_exception_handler(unreachable, _shared_store_error)


SHARED_STORE_ERRORS = (RedisError, StorageError)  # FLYWHEEL_REDIS_URL set, Redis not there
SHARED_STORE_RETRY = {"Retry-After": "1"}


def shared_store_message(error: Exception) -> str:
    return f"the shared limit store (Redis) is unavailable: {type(error).__name__}"


async def _shared_store_error(_request: Request, error: Exception) -> JSONResponse:
    message = shared_store_message(error)
    return error_response(503, "shared_store_unavailable", message, headers=SHARED_STORE_RETRY)


def error_headers(error: FlywheelError) -> dict[str, str] | None:
    """The headers an error's status asks for: Retry-After on 429, WWW-Authenticate on 401."""
    if isinstance(error, RateLimited):
        return {"Retry-After": str(max(1, round(error.retry_after_s + 0.5)))}
    if isinstance(error, Unauthenticated):
        return {"WWW-Authenticate": "Bearer"}
    return None


async def _flywheel_error(_request: Request, error: FlywheelError) -> JSONResponse:
    status = STATUS_BY_CODE.get(error.code, 400)
    return error_response(
        status, error.code, error.message, details=error.details, headers=error_headers(error)
    )


async def _validation_error(_request: Request, error: RequestValidationError) -> JSONResponse:
    details = [_validation_detail(item) for item in error.errors()]
    first = details[0]["message"] if details else "invalid request"
    return error_response(422, InvalidInput.code, f"invalid request: {first}", details=details)


def _validation_detail(item: dict[str, Any]) -> dict[str, Any]:
    """One pydantic error, without echoing the input (it may hold what we refused to store)."""
    location = [part for part in item.get("loc", ()) if part != "body"]
    detail: dict[str, Any] = {
        "code": str(item.get("type", "invalid")),
        "message": ".".join(str(part) for part in location) + f": {item.get('msg', '')}",
        "loc": [str(part) if not isinstance(part, int) else part for part in location],
    }
    if len(location) >= 2 and location[0] == "events" and isinstance(location[1], int):
        detail["index"] = location[1]
    return detail


async def _http_error(_request: Request, error: HTTPException) -> JSONResponse:
    unparsable = _unparsable_body(error)
    if unparsable is not None:
        detail = {"code": "json_invalid", "message": unparsable, "loc": []}
        return error_response(
            422, InvalidInput.code, f"invalid request: {unparsable}", details=[detail]
        )
    code = CODE_BY_HTTP_STATUS.get(error.status_code, "http_error")
    headers = dict(error.headers) if error.headers else None
    return error_response(error.status_code, code, str(error.detail), headers=headers)


def _unparsable_body(error: HTTPException) -> str | None:
    """Why a body FastAPI could not parse was refused.

    FastAPI answers a `JSONDecodeError` with a validation error (422), but any other failure of
    `json.loads` with a bare 400 raised `from` it: bytes that are not UTF-8, nesting past the
    interpreter's recursion limit, an integer longer than Python's 4,300-digit parsing limit.
    They are the same class of error as malformed JSON, so they get the same 422 and body.
    """
    cause = error.__cause__
    if error.status_code != 400 or cause is None:
        return None
    if isinstance(cause, UnicodeDecodeError):
        return "the body is not valid UTF-8"
    if isinstance(cause, RecursionError):
        return "the body's JSON nests too deeply"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        return f"the body's JSON holds an integer of more than {MAX_INT_DIGITS} digits"
    return "the body could not be parsed as JSON"

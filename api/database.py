"""The request's transaction: one unit of work, run off the event loop in one thread hop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from flywheel.db import core_transaction, unit_of_work

T = TypeVar("T")


async def in_transaction(request: Request, operation: Callable[..., T], **kwargs: Any) -> T:
    """Run `operation(session=..., **kwargs)` in a worker thread inside one transaction.

    The transaction commits before the response is built, so a 2xx always means stored.
    Handlers are `async def` and call this once: a sync handler would cost FastAPI a second
    thread hop to validate the response.
    """

    def run() -> T:
        with unit_of_work(request.app.state.sessions) as session:
            return operation(session=session, **kwargs)

    return await run_in_threadpool(run)


async def in_core_transaction(request: Request, operation: Callable[..., T], **kwargs: Any) -> T:
    """Run `operation(connection=..., **kwargs)` in a worker thread inside one transaction on
    a Core connection (`flywheel.db.core_transaction`): for the single-row writes, whose
    services run Core statements only. Commits before the response is built, as above."""

    def run() -> T:
        with core_transaction(request.app.state.sessions) as connection:
            return operation(connection=connection, **kwargs)

    return await run_in_threadpool(run)

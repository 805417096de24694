"""Liveness, readiness (the database answers) and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from api.errors import error_response
from api.schemas import ErrorBody, Health

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness")
async def healthz() -> Health:
    """`{"status": "ok"}` while the process serves requests; no API key needed."""
    return Health(status="ok")


@router.get(
    "/readyz",
    responses={503: {"model": ErrorBody, "description": "The database does not answer."}},
    response_model=Health,
    summary="Readiness",
)
def readyz(request: Request) -> Response:
    """200 once the database answers a query, else 503; no API key needed."""
    try:
        with request.app.state.sessions() as session:
            session.execute(text("SELECT 1"))
    except SQLAlchemyError as error:
        return error_response(
            503, "database_unavailable", f"database unreachable: {type(error).__name__}"
        )
    return Response('{"status":"ok"}', media_type="application/json")


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus metrics",
    responses={200: {"content": {"text/plain": {}}, "description": "The text exposition format."}},
)
async def metrics(request: Request) -> Response:
    """Request counts and latencies by route and status, events ingested by kind, in the
    Prometheus text format; no API key needed."""
    return Response(
        generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )

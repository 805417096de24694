"""Liveness, readiness (the database answers) and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from api.errors import error_response
from api.schemas import ErrorBody, Health

router = APIRouter()


@router.get("/healthz")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", responses={503: {"model": ErrorBody}}, response_model=Health)
def readyz(request: Request) -> Response:
    try:
        with request.app.state.sessions() as session:
            session.execute(text("SELECT 1"))
    except SQLAlchemyError as error:
        return error_response(
            503, "database_unavailable", f"database unreachable: {type(error).__name__}"
        )
    return Response('{"status":"ok"}', media_type="application/json")


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    return Response(
        generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )

"""The comparison point for bench/feedback_api.py: a bare FastAPI endpoint, one plain INSERT.

No auth, no validation beyond parsing JSON, no idempotency: what the full endpoint is measured
against. Run by the benchmark with uvicorn's factory mode and FLYWHEEL_DATABASE_URL set.
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime

from fastapi import FastAPI, Request
from sqlalchemy import Column, DateTime, MetaData, Table, Uuid, create_engine
from sqlalchemy.dialects.postgresql import JSONB
from starlette.concurrency import run_in_threadpool

METADATA = MetaData()
BARE_EVENTS = Table(
    "bench_bare_events",
    METADATA,
    Column("id", Uuid, primary_key=True),
    Column("body", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)


def create_app() -> FastAPI:
    # The same pool as Flywheel's own engine (flywheel.db.make_engine) with its defaults.
    pool_size = int(os.environ.get("FLYWHEEL_DB_POOL_SIZE", "20"))
    engine = create_engine(
        os.environ["FLYWHEEL_DATABASE_URL"], pool_size=pool_size, max_overflow=0, pool_recycle=1800
    )
    app = FastAPI()

    @app.post("/bare", status_code=201)
    async def bare(request: Request) -> dict[str, str]:
        body = await request.json()
        row_id = uuid.uuid4()

        def insert() -> None:
            with engine.begin() as connection:
                connection.execute(
                    BARE_EVENTS.insert().values(id=row_id, body=body, created_at=datetime.now(UTC))
                )

        await run_in_threadpool(insert)
        return {"id": str(row_id)}

    return app

"""The comparison point for bench/feedback_api.py: a bare FastAPI endpoint, one plain INSERT.

It writes the same row into the same `feedback_events` table (same indexes and foreign keys)
as `POST /v1/feedback`, but with no auth, no validation beyond parsing JSON, no idempotency and
no domain lookup: the tenant and domain come from BENCH_TENANT_ID and BENCH_DOMAIN_ID. Run by
the benchmark with uvicorn's factory mode and FLYWHEEL_DATABASE_URL set.
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime

from fastapi import FastAPI, Request
from sqlalchemy import create_engine, insert
from starlette.concurrency import run_in_threadpool

from flywheel.feedback.models import FeedbackEvent


def create_app() -> FastAPI:
    # The same pool as Flywheel's own engine (flywheel.db.make_engine) with its defaults.
    pool_size = int(os.environ.get("FLYWHEEL_DB_POOL_SIZE", "20"))
    engine = create_engine(
        os.environ["FLYWHEEL_DATABASE_URL"], pool_size=pool_size, max_overflow=0, pool_recycle=1800
    )
    tenant_id = uuid.UUID(os.environ["BENCH_TENANT_ID"])
    domain_id = uuid.UUID(os.environ["BENCH_DOMAIN_ID"])
    app = FastAPI()

    @app.post("/bare", status_code=201)
    async def bare(request: Request) -> dict[str, str]:
        body = await request.json()
        row_id = uuid.uuid4()
        row = {
            "id": row_id,
            "created_at": datetime.now(UTC),
            "tenant_id": tenant_id,
            "domain_id": domain_id,
            "kind": body["kind"],
            "value": body["value"],
            "messages": [{"role": "user", "content": body["prompt"]}],
            "response": body["response"],
            "rater": body.get("rater"),
            "request_sha256": "",
        }

        def write() -> None:
            with engine.begin() as connection:
                connection.execute(insert(FeedbackEvent), row)

        await run_in_threadpool(write)
        return {"id": str(row_id)}

    return app

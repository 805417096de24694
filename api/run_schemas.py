"""Bodies of the runs API (`/v1/runs`). Unknown fields are rejected, as everywhere."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from flywheel.feedback.values import Name, StrictModel

RunStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "skipped"]


class RunCreate(StrictModel):
    """Queue a cycle of the domain: compile, build, train, evaluate, promote."""

    domain: Name


class RunRead(BaseModel):
    id: uuid.UUID
    domain: str
    method: str = Field(description="cycle, or a single training: sft, dpo, kto, grpo.")
    status: RunStatus
    trigger: str | None = Field(description="What queued a cycle: api, manual or schedule.")
    steps: dict[str, Any] = Field(description="A cycle's steps: status, timings, result.")
    error: str | None
    dataset_version_id: uuid.UUID | None
    mlflow_run_id: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    cancel_requested_at: datetime | None


class RunList(BaseModel):
    items: list[RunRead]

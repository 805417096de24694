"""Training signal over the API: list preference pairs and tasks, add tasks."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, Response

from api import examples
from api.auth import require
from api.database import in_transaction
from api.openapi import READ_ERRORS, WRITE_ERRORS
from api.schemas import (
    PreferencePairPage,
    PreferencePairRead,
    TaskCreate,
    TaskPage,
    TaskRead,
)
from flywheel.feedback.values import Name, as_json
from flywheel.signals import service
from flywheel.signals.candidates import Provenance, TaskCandidate
from flywheel.signals.models import VerifiableTask
from flywheel.tenancy.service import Principal, Scope

router = APIRouter(prefix="/v1", tags=["training signal"])

Reader = Annotated[Principal, Depends(require(Scope.DATA_READ))]
Writer = Annotated[Principal, Depends(require(Scope.FEEDBACK_WRITE))]
DomainQuery = Annotated[Name, Query(description="The domain's name.", examples=["billing"])]
After = Annotated[uuid.UUID | None, Query(description="The `next_after` of the last page.")]
Limit = Annotated[int, Query(ge=1, le=500, description="At most this many.", examples=[100])]


@router.get(
    "/preference-pairs",
    responses=READ_ERRORS,
    summary="List preference pairs",
    description=(
        "The domain's compiled preference pairs (chosen and rejected response to the same "
        "conversation, with why and a weight), oldest first, a page at a time: pass the "
        "page's `next_after` as `after` for the next one. Scope `data:read`."
    ),
)
async def list_preference_pairs(
    request: Request,
    principal: Reader,
    domain: DomainQuery,
    after: After = None,
    limit: Limit = 100,
) -> PreferencePairPage:
    page = await in_transaction(
        request,
        service.list_preference_pairs,
        tenant_id=principal.tenant_id,
        domain=domain,
        after=after,
        limit=limit,
    )
    items = [PreferencePairRead.model_validate(pair, from_attributes=True) for pair in page.items]
    return PreferencePairPage(items=items, next_after=page.next_after)


@router.get(
    "/tasks",
    responses=READ_ERRORS,
    summary="List verifiable tasks",
    description=(
        "The domain's tasks as a model may see them (never the hidden tests, reference "
        "solution or answer), optionally only those in a verifier `status`, a page at a time "
        "(`after` = the last page's `next_after`). Scope `data:read`."
    ),
)
async def list_tasks(
    request: Request,
    principal: Reader,
    domain: DomainQuery,
    status: Literal["pending", "usable", "unusable"] | None = None,
    after: After = None,
    limit: Limit = 100,
) -> TaskPage:
    page = await in_transaction(
        request,
        service.list_tasks,
        tenant_id=principal.tenant_id,
        domain=domain,
        status=status,
        after=after,
        limit=limit,
    )
    return TaskPage(items=[_task_read(task) for task in page.items], next_after=page.next_after)


@router.post(
    "/tasks",
    status_code=201,
    response_model=TaskRead,
    responses={**WRITE_ERRORS, 200: {"model": TaskRead, "description": "Already stored."}},
    summary="Add a verifiable task",
    openapi_extra=examples.TASK,
)
async def create_task(body: TaskCreate, request: Request, principal: Writer) -> Response:
    """Store a task, pending verifier QA; the same content again returns the stored one (200).

    A `code` task needs `entry_point` and `hidden_tests` (Python), an `answer` task `answer`,
    a `tool_call` task `tools` and `expected_calls`, an `environment` task `tools` and
    `environment`; what checks a task (tests, answer, calls, environment) is never returned.
    Tasks of one `group` always land in the same split. Scope `feedback:write`.
    """
    task_id = body.task_id or str(uuid.uuid4())
    candidate = TaskCandidate(
        provenance=Provenance("api", source_ref=task_id, group_key=body.group or task_id),
        prompt=body.prompt,
        entry_point=body.entry_point,
        reference_solution=body.reference_solution,
        hidden_tests=body.hidden_tests,
        visible_tests=body.visible_tests,
        task_kind=body.kind,
        answer=body.answer,
        language=body.language,
        messages=as_json(body.messages),
        tools=as_json(body.tools),
        expected_calls=body.expected_calls,
        environment=body.environment,
    )
    task, is_new = await in_transaction(
        request, service.add_task, tenant_id=principal.tenant_id, domain=body.domain, task=candidate
    )
    return Response(
        _task_read(task).model_dump_json(),
        status_code=201 if is_new else 200,
        media_type="application/json",
    )


def _task_read(task: VerifiableTask) -> TaskRead:
    return TaskRead(
        id=task.id,
        kind=task.task_kind,
        prompt=task.prompt,
        entry_point=task.entry_point,
        visible_tests=task.visible_tests,
        messages=task.messages,
        tools=task.tools,
        language=task.language,
        verifier_status=task.verifier_status,
        verifier_reason=task.verifier_reason,
        difficulty=task.difficulty,
        source_kind=task.source_kind,
        source_ref=task.source_ref,
        group_key=task.group_key,
        created_at=task.created_at,
    )

"""Dataset versions over the API: list a domain's versions, build the next one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response

from api import examples
from api.auth import require
from api.database import in_transaction
from api.openapi import READ_ERRORS, WRITE_ERRORS
from api.schemas import DatasetVersionBuilt, DatasetVersionList, DatasetVersionRead, RecipeCreate
from flywheel.datasets import service
from flywheel.datasets.models import DatasetVersion
from flywheel.datasets.versions import list_versions
from flywheel.feedback.values import Name
from flywheel.tenancy.service import Principal, Scope

router = APIRouter(prefix="/v1", tags=["datasets"])

Reader = Annotated[Principal, Depends(require(Scope.DATA_READ))]
Builder = Annotated[Principal, Depends(require(Scope.MODELS_WRITE))]


@router.get("/datasets", responses=READ_ERRORS, summary="List dataset versions")
async def list_datasets(
    request: Request,
    principal: Reader,
    domain: Annotated[Name, Query(description="The domain's name.", examples=["billing"])],
) -> DatasetVersionList:
    """The domain's dataset versions, newest first: immutable, content-addressed snapshots
    with their recipe, split stats and lineage. Scope `data:read`."""
    versions = await in_transaction(
        request, list_versions, tenant_id=principal.tenant_id, domain=domain
    )
    return DatasetVersionList(items=[_read(version, domain) for version in versions])


@router.post(
    "/datasets/{domain}/versions",
    status_code=201,
    response_model=DatasetVersionBuilt,
    responses={
        **WRITE_ERRORS,
        200: {"model": DatasetVersionBuilt, "description": "Nothing new."},
    },
    summary="Build the next dataset version",
    openapi_extra=examples.RECIPE,
)
async def build_dataset(
    domain: Annotated[Name, Path(description="The domain's name.", examples=["billing"])],
    request: Request,
    principal: Builder,
    body: Annotated[RecipeCreate | None, Body()] = None,
) -> Response:
    """Build the domain's next version from its signal (the body, optional, is the recipe;
    each field has the platform default): 201 with it, or 200 with the latest one when
    nothing changed; `warnings` say when its eval split is empty or below the gate's minimum,
    and how to fix it. Scope `models:write`."""
    recipe = service.DatasetRecipe(**(body or RecipeCreate()).model_dump())
    built = await in_transaction(
        request, service.build_for, tenant_id=principal.tenant_id, domain=domain, recipe=recipe
    )
    answer = DatasetVersionBuilt(
        **_read(built.version, domain).model_dump(), warnings=built.warnings
    )
    return Response(
        answer.model_dump_json(),
        status_code=201 if built.is_new else 200,
        media_type="application/json",
    )


def _read(version: DatasetVersion, domain: str) -> DatasetVersionRead:
    return DatasetVersionRead(
        id=version.id,
        domain=domain,
        version=version.version,
        manifest_sha256=version.manifest_sha256,
        eval_sha256=version.eval_sha256,
        recipe=version.recipe,
        stats=version.stats,
        parent_id=version.parent_id,
        created_at=version.created_at,
        tainted_at=version.tainted_at,
    )

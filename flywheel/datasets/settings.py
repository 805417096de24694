"""A domain's dataset settings: the `dataset` mapping of its config, parsed and checked.

    {"dataset": {"min_eval_items": 30}}

`min_eval_items` (default 0: none): the eval set the domain wants at least. While its eval
groups hold fewer eligible items, a build puts new groups in eval first, lowest hash position
first, until they do (flywheel.datasets.split); groups already placed keep their split. It
counts items of every kind; the gate counts those of its primary metric (pass@1: tasks,
preference accuracy: pairs, exact match: SFT examples), so a domain whose eval set mixes kinds
may want more than the gate's `min_items`. Set it with `flywheel domains configure`, before
the first build of a small domain (a pilot): the groups a build placed in train stay there.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flywheel.errors import InvalidInput
from flywheel.tenancy.models import Domain


class DatasetSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_eval_items: int = Field(default=0, ge=0)


def dataset_settings(domain: Domain) -> DatasetSettings:
    """The domain's `dataset` config; InvalidInput naming the first bad field."""
    raw = (domain.config or {}).get("dataset") or {}
    try:
        return DatasetSettings.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "dataset"
        raise InvalidInput(
            f"domain {domain.name}'s dataset config: {where}: {first['msg']}"
        ) from error

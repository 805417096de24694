"""A domain's cycle settings: the `cycle` mapping of its config, parsed and checked.

{"cycle": {"methods": ["sft", "dpo"],            # sft|dpo|kto|grpo, in order (default sft)
           "configs": {"sft": "sft.yaml"},        # a YAML training config per method
           "overrides": {"sft": ["max_steps=200"]},
           "recipe": {"eval_fraction": 0.2},      # dataset build recipe fields
           "eval": {"max_new_tokens": 16, "k": 4},
           "auto_promote": true,                  # promote when the gate passes
           "schedule": "0 2 * * 1",               # weekly retraining, cron (UTC)
           "min_new_signal": 50}}                 # items since the champion's dataset
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from flywheel.datasets.service import DatasetRecipe
from flywheel.errors import InvalidInput
from flywheel.tenancy.models import Domain

Method = Literal["sft", "dpo", "kto", "grpo"]


class EvalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(default=128, ge=1)
    k: int = Field(default=4, ge=1)


class CycleSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    methods: list[Method] = Field(default_factory=lambda: list[Method](["sft"]), min_length=1)
    configs: dict[Method, Path] = Field(default_factory=dict)
    overrides: dict[Method, list[str]] = Field(default_factory=dict)
    recipe: dict[str, object] = Field(default_factory=dict)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    auto_promote: bool = True
    schedule: str | None = "0 2 * * 1"  # null: no scheduled cycles
    min_new_signal: int = Field(default=50, ge=0)

    @field_validator("schedule")
    @classmethod
    def _cron(cls, schedule: str | None) -> str | None:
        if schedule is not None and not _is_cron(schedule):
            raise ValueError(f"not a cron expression: {schedule!r}")
        return schedule

    def dataset_recipe(self) -> DatasetRecipe:
        try:
            recipe = DatasetRecipe(**self.recipe)  # type: ignore[arg-type]
        except TypeError as error:
            raise InvalidInput(f"the domain's cycle recipe: {error}") from error
        recipe.check()
        return recipe


@functools.lru_cache(maxsize=1024)
def _is_cron(schedule: str) -> bool:
    """croniter's check, once per distinct schedule (a tick reads every domain's config)."""
    return bool(croniter.is_valid(schedule))


def cycle_settings(domain: Domain) -> CycleSettings:
    """The domain's `cycle` config; InvalidInput naming the first bad field."""
    raw = (domain.config or {}).get("cycle") or {}
    try:
        return CycleSettings.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise InvalidInput(
            f"domain {domain.name}'s cycle config: {where}: {first['msg']}"
        ) from error

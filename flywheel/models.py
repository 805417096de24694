"""Every table, in one import: what Alembic and the schema tests see."""

from flywheel.datasets.models import (
    DatasetGroup,
    DatasetMember,
    DatasetVersion,
    EvalIndexPart,
    ItemSketch,
)
from flywheel.db import Base
from flywheel.feedback.models import FeedbackBatch, FeedbackEvent, ForgetRequest, Interaction
from flywheel.registry.models import ModelVersion, PromotionEvent, Run, WebhookDelivery
from flywheel.scheduling.models import ScheduledCycle
from flywheel.signals.models import (
    IngestRun,
    LabeledCompletion,
    PreferencePair,
    SftExample,
    VerifiableTask,
)
from flywheel.suites.models import Suite, SuiteMember, SuiteRun
from flywheel.tenancy.models import ApiKey, Domain, Tenant

__all__ = [
    "ApiKey",
    "Base",
    "DatasetGroup",
    "DatasetMember",
    "DatasetVersion",
    "Domain",
    "EvalIndexPart",
    "FeedbackBatch",
    "FeedbackEvent",
    "ForgetRequest",
    "IngestRun",
    "Interaction",
    "ItemSketch",
    "LabeledCompletion",
    "ModelVersion",
    "PreferencePair",
    "PromotionEvent",
    "Run",
    "ScheduledCycle",
    "SftExample",
    "Suite",
    "SuiteMember",
    "SuiteRun",
    "Tenant",
    "VerifiableTask",
    "WebhookDelivery",
]

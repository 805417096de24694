"""Schemathesis against the app's own OpenAPI schema: no 5xx, no response outside the schema.

Every operation gets a bounded number of generated requests, schema-valid ones and ones that
break the schema (negative data, which must be refused), sent with an admin key so that
generated bodies reach the handlers and the database. `status_code_conformance` fails on any
status the operation does not document.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from schemathesis import GenerationMode, checks
from sqlalchemy.orm import Session, sessionmaker

from api import datasets, feedback, health, registry, runs, signals
from api.app import create_app
from flywheel.settings import Settings
from tests.conftest import make_caller

MAX_EXAMPLES = 40  # per operation, positive and negative together: under a minute in all
# Cross-field rules ("exactly one of messages or prompt") are not in the JSON Schema, so a
# schema-valid body may rightly get 422: `positive_data_acceptance` is left out on purpose.
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
]
# Schemathesis' default statuses for rejected negative data, plus 413: a body over the size
# cap is refused before it is parsed, which is a rejection too. Undeclared query parameters and
# headers are ignored, as HTTP servers do, so adding them does not make a request invalid.
REJECTIONS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
CONFIG = schemathesis.Config.from_dict(
    {
        "generation": {"allow-extra-parameters": False},
        "checks": {"negative_data_rejection": {"expected-statuses": [*REJECTIONS, "5xx"]}},
    }
)
OPERATIONS = [
    result.ok().label
    for result in schemathesis.openapi.from_asgi(
        "/openapi.json", create_app(Settings())
    ).get_all_operations()
]


@pytest.mark.parametrize("label", OPERATIONS)
def test_no_server_errors_and_responses_match_the_schema(
    label: str, settings: Settings, sessions: sessionmaker[Session]
) -> None:
    caller = make_caller(sessions, scopes=("admin",))
    schema = schemathesis.openapi.from_asgi(
        "/openapi.json", create_app(settings, sessions=sessions), config=CONFIG
    )
    operation = next(
        result.ok() for result in schema.get_all_operations() if result.ok().label == label
    )

    # The key is fixed, not generated: a negative case that drops it would be sent with it.
    strategy = operation.as_strategy(GenerationMode.POSITIVE, headers=caller.headers)
    if _has_inputs(operation):
        negative = operation.as_strategy(GenerationMode.NEGATIVE, headers=caller.headers)
        strategy = st.one_of(strategy, negative)

    @given(case=strategy)
    @hypothesis_settings(
        max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck)
    )
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(headers=caller.headers, checks=CHECKS)

    check()


def _has_inputs(operation: Any) -> bool:
    """Whether there is anything to make invalid (an operation without parameters or a body,
    like GET /healthz, has no negative cases)."""
    definition = operation.definition.raw
    return bool(definition.get("parameters") or definition.get("requestBody"))


def test_every_operation_is_fuzzed() -> None:
    """Each route of every router is in the schema, so it is among the fuzzed operations."""
    routes = {
        f"{method} {route.path}"
        for module in (datasets, feedback, health, registry, runs, signals)
        for route in module.router.routes
        if isinstance(route, APIRoute) and route.include_in_schema
        for method in route.methods or ()
    }
    assert routes == set(OPERATIONS)

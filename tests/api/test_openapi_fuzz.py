"""Schemathesis against the app's own OpenAPI schema: no 5xx, no response outside the schema.

Each operation gets a bounded number of generated requests (valid and invalid ones), sent with
an admin key so that generated bodies reach the handlers and the database.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from schemathesis import checks
from sqlalchemy.orm import Session, sessionmaker

from api.app import create_app
from flywheel.settings import Settings
from tests.conftest import make_caller

MAX_EXAMPLES = 40
# Cross-field rules ("exactly one of messages or prompt") are not in the JSON Schema, so a
# schema-valid body may rightly get 422: `positive_data_acceptance` is left out on purpose.
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
]
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
        "/openapi.json", create_app(settings, sessions=sessions)
    )
    operation = next(
        result.ok() for result in schema.get_all_operations() if result.ok().label == label
    )

    @given(case=operation.as_strategy())
    @hypothesis_settings(
        max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck)
    )
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(headers=caller.headers, checks=CHECKS)

    check()

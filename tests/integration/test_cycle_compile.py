"""A cycle's compile step is the feedback compiler itself, called directly: it compiles the
domain's new feedback even when the installed package registers no entry points at all (a
step that looked its compilers up by entry point compiled nothing then, silently). The cycle
stops at the build here (one prompt: no eval or no training items), before any training."""

from __future__ import annotations

import importlib.metadata

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from flywheel.scheduling.cycle import CycleRequest, run_cycle
from flywheel.settings import Settings
from tests.conftest import Caller, count_rows


def test_the_compile_step_compiles_new_feedback_with_no_plugin_installed(
    client: TestClient,
    acme: Caller,
    sessions: sessionmaker[Session],
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    comparison = {
        "domain": "billing",
        "kind": "comparison",
        "value": {
            "messages": [{"role": "user", "content": "How do I get a refund?"}],
            "responses": ["Ask support.", "Open Settings > Billing > Refund."],
            "preferred": 1,
        },
    }
    assert client.post("/v1/feedback", json=comparison, headers=acme.headers).status_code == 201
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **_: [])  # none installed

    outcome = run_cycle(sessions, CycleRequest(acme.tenant_id, "billing"), settings)

    compiled = outcome.steps["compile"]
    assert compiled["status"] == "succeeded"
    assert (
        compiled["result"]["feedback"]["pairs"],
        compiled["result"]["feedback"]["events_read"],
    ) == (1, 1)
    assert count_rows(sessions, "preference_pairs") == 1
    # one prompt is one group: the build puts it in train or in eval (a hash of the domain id
    # decides), so the cycle stops there, with no eval items or no training items
    assert list(outcome.steps) == ["compile", "build"]
    assert outcome.status in ("failed", "skipped")
    assert "no eval items" in (outcome.error or "") or "no training items" in (outcome.error or "")

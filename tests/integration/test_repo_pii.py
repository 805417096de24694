"""A repository test that holds a value redaction would replace (an email, a card number) is
left out of the task, and a function with no other test is rejected, saying so: stored, the
value would be a surrogate, and the test would fail or pass for another reason."""

from __future__ import annotations

from pathlib import Path

from flywheel.redaction import redact
from flywheel.sandbox.qa import TaskSpec, check_task
from flywheel.signals.candidates import TaskCandidate
from ingest.framework import Rejected
from ingest.repo import RepositoryIngestor
from ingest.repo.discover import FoundTest
from ingest.repo.tasks import without_pii

CONTACTKIT = Path(__file__).parent.parent / "fixtures" / "repos" / "contactkit"


def ingest_contactkit() -> dict[str, TaskCandidate | Rejected]:
    outcomes: dict[str, TaskCandidate | Rejected] = {}
    with RepositoryIngestor(str(CONTACTKIT)) as ingestor:
        for record in ingestor.records():
            name = record.ref.rsplit("::", 1)[-1]
            try:
                (outcomes[name],) = ingestor.convert(record)  # type: ignore[assignment]
            except Rejected as rejected:
                outcomes[name] = rejected
    return outcomes


def test_tests_holding_pii_are_left_out_and_what_is_kept_redaction_leaves_alone() -> None:
    outcomes = ingest_contactkit()

    task = outcomes["mail_domain"]
    assert isinstance(task, TaskCandidate)
    tests = task.hidden_tests or ""
    assert "test_mail_domain_without_an_at_sign" in tests
    assert "maria.lopez" not in tests  # its test with an address is not kept
    for code in (tests, task.reference_solution or ""):
        assert redact(code, people=False).text == code  # the store keeps it as it is
    spec = TaskSpec("mail_domain", task.prompt, task.reference_solution or "", tests, "mail_domain")
    assert check_task(spec).status == "usable"

    rejected = outcomes["last_digits"]
    assert isinstance(rejected, Rejected)
    assert rejected.reason == "holds_pii"
    assert "CARD" in rejected.detail


def test_a_test_naming_a_commit_author_is_left_out_as_the_store_would_rewrite_it() -> None:
    """The store redacts code with the people its source names (the commit authors)."""
    named = FoundTest(
        origin="tests/test_greet.py::test_greet",
        name="test_greet",
        targets=frozenset(),
        code="def test_greet():\n    assert greet('Ada Lovelace') == 'Hi Ada Lovelace'\n",
    )

    (anonymous,) = without_pii([named])
    (as_stored,) = without_pii([named], names=["Ada Lovelace"])

    assert anonymous.reason is None  # no free-text names are looked for in code
    assert as_stored.reason == "holds_pii"
    assert "NAME" in as_stored.detail

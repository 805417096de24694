"""Feedback JSONL: one event per line in the REST wire format of `POST /v1/feedback`.

A line without `interaction_id` or `domain` goes to the domain the run ingests into. Each
event is stored under an idempotency key derived from its line number and content, so
reading the same file again (or the same file with lines appended) adds only what is new.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from flywheel.errors import InvalidInput
from flywheel.feedback.service import new_feedback
from flywheel.feedback.values import FeedbackCreate
from flywheel.signals.candidates import Candidate, EventCandidate, Provenance
from ingest.framework import SourceRecord
from ingest.jsonl import file_sha256, read_objects

FEEDBACK_LINE: TypeAdapter[Any] = TypeAdapter(FeedbackCreate)


class FeedbackFileIngestor:
    source_kind = "feedback"
    source_format = "jsonl"
    version = "feedback-jsonl/1"
    records_are_groups = False

    def __init__(self, path: Path, domain: str) -> None:
        self.path = path
        self.domain = domain

    @property
    def source_ref(self) -> str:
        return str(self.path)

    def fingerprint(self) -> str:
        return file_sha256(self.path)

    def records(self) -> Iterator[SourceRecord]:
        for position, (line, data) in enumerate(read_objects(self.path)):
            yield SourceRecord(position, f"{self.path.name} line {line}", (line, data))

    def convert(self, record: SourceRecord) -> list[Candidate]:
        line, data = record.payload[0], dict(record.payload[1])
        if "interaction_id" not in data:
            data.setdefault("domain", self.domain)
        if data.get("domain", self.domain) != self.domain:
            raise InvalidInput(
                f"{record.ref}: domain {data['domain']!r} is not the domain being ingested "
                f"({self.domain!r})"
            )
        try:
            body = FEEDBACK_LINE.validate_python(data)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise InvalidInput(f"{record.ref}: {where}: {first['msg']}") from error
        canonical = json.dumps(
            [self.domain, line, record.payload[1]], sort_keys=True, ensure_ascii=False
        )
        digest = hashlib.sha256(canonical.encode()).hexdigest()
        return [
            EventCandidate(
                provenance=Provenance("feedback", record.ref, group_key=self.domain),
                event=new_feedback(body),
                idempotency_key=f"jsonl:{digest[:48]}",
            )
        ]

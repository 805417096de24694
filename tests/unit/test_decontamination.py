"""Decontamination of train candidates against frozen eval sets, without a database."""

from __future__ import annotations

import random

import pytest

from flywheel.datasets import decontamination
from flywheel.datasets.decontamination import (
    NEAR_DUPLICATE,
    NGRAM_OVERLAP,
    DecontaminationConfig,
    EvalIndex,
    ngrams,
)
from flywheel.errors import InvalidInput
from flywheel.signals.dedup import minhash_signature

EVAL_ITEMS = [
    "To move from the Team plan to the Pro plan open Settings then Billing and choose Change "
    "plan; the difference is charged pro rata on your next invoice and seats carry over.",
    "Webhook deliveries are retried eight times with exponential backoff over roughly two "
    "days, after which the event is marked failed and shown in the delivery log.",
    "Single sign-on with SAML is included in the Enterprise tier; ask your account manager "
    "for the metadata URL and we will enable it for your workspace within a day.",
]
UNRELATED = [
    "The quarterly report shows revenue growth in every region except the north, where a "
    "supplier dispute delayed two large shipments until the following month.",
    "Our office will be closed for the public holiday on Monday; support requests sent over "
    "the weekend are answered in the order they arrived on Tuesday morning.",
    "You can change the language of the dashboard under Profile, where the list of available "
    "translations is updated with each release of the web application.",
]
FILLER = (
    "Thanks for getting in touch with us today about your account. Here is what we found "
    "after looking into it with the team this afternoon:"
)
RENEWAL = (
    "Please cancel the renewal of subscription 4417 before Friday because our team is moving "
    "to another vendor next quarter"
)  # 19 words: shingled by characters, so a one-digit edit keeps it a near-duplicate
REPLY_WORDS = 120  # one substitution in 118 word 3-grams keeps the Jaccard index near 0.95


def words(text: str) -> list[str]:
    return text.split()


def span(text: str, start: int, count: int) -> str:
    return " ".join(words(text)[start : start + count])


def vocabulary_text(rng: random.Random, count: int) -> str:
    return " ".join(f"w{rng.randrange(5_000)}" for _ in range(count))


def substitute(text: str, position: int, word: str) -> str:
    edited = words(text)
    edited[position] = word
    return " ".join(edited)


@pytest.fixture(scope="module")
def index() -> EvalIndex:
    return EvalIndex.build((text, None) for text in EVAL_ITEMS)


# n-grams and normalisation


def test_a_text_yields_one_gram_per_window_of_n_words() -> None:
    text = " ".join(f"word{index}" for index in range(20))

    assert len(ngrams(text, 13)) == 8
    assert len(ngrams(text, 20)) == 1
    assert len(ngrams(text, 1)) == 20
    assert ngrams(span(text, 3, 13), 13) < ngrams(text, 13)


def test_word_order_matters() -> None:
    text = " ".join(f"word{index}" for index in range(13))

    assert ngrams(text) != ngrams(" ".join(reversed(words(text))))


def test_a_text_shorter_than_n_yields_one_gram_of_all_its_words() -> None:
    question = "Is my data stored in the EU?"
    longer = f"{question} And who can read it?"

    assert len(ngrams(question)) == 1
    assert ngrams(question) == ngrams("is my data stored in the eu")
    # Not a prefix gram of a longer text, nor the n-gram of a text of exactly n words.
    assert not ngrams(question) & ngrams(longer)
    assert not ngrams(question, 7) & ngrams(question, 6)


def test_a_text_without_words_yields_no_gram() -> None:
    assert ngrams("") == set()
    assert ngrams("  \n\t ") == set()
    assert ngrams("?! -- ... ;)") == set()


@pytest.mark.parametrize(
    ("variant", "plain"),
    [
        ("HELLO World", "hello world"),
        ("Hello, world! (Really.)", "hello world really"),
        ("don't re-send the e-mail", "dont resend the email"),
        (
            "\u201cquoted\u201d \u2014 \u00abguillemets\u00bb and \u2018single\u2019",
            "quoted guillemets and single",
        ),
        ("price: $5 + 10% = €6", "price 5 10 6"),
        ("\uff26\uff35\uff2c\uff2c \uff37\uff29\uff24\uff34\uff28", "full width"),
        ("the \ufb01le was \ufb02agged", "the file was flagged"),  # ligatures
        ("STRASSE", "straße"),
        ("non\u00a0breaking\u2003spaces\n\nand\ttabs", "non breaking spaces and tabs"),
        ("pass\u200bword soft\u00adhyphen \ufeffbom", "password softhyphen bom"),
        ("Привет, мир!", "привет мир"),
        ("cafe\u0301", "café"),
    ],
)
def test_normalisation_ignores_case_punctuation_symbols_and_unicode_forms(
    variant: str, plain: str
) -> None:
    assert ngrams(variant, 2) == ngrams(plain, 2)


def test_normalisation_keeps_letters_digits_and_combining_marks() -> None:
    assert ngrams("order 12345 failed", 2) != ngrams("order 12346 failed", 2)
    assert ngrams("नमस्ते दुनिया", 2) != ngrams("नमसत दनय", 2)  # Devanagari vowel signs are marks
    assert ngrams("well-known", 2) != ngrams("well known", 2)  # deleted, not a word break


def test_n_must_be_positive() -> None:
    with pytest.raises(InvalidInput, match="at least one word"):
        ngrams("a b c", 0)


# n-gram overlap


def test_a_planted_13_word_span_in_a_longer_text_is_caught(index: EvalIndex) -> None:
    for item in EVAL_ITEMS:
        for start in (0, 5, len(words(item)) - 13):
            planted = f"{FILLER} {span(item, start, 13)} {UNRELATED[0]}"

            assert index.check(planted) == NGRAM_OVERLAP


def test_a_planted_span_is_caught_through_case_and_punctuation_changes(index: EvalIndex) -> None:
    copied = span(EVAL_ITEMS[0], 8, 13).upper().replace(";", " --").replace(" ", "  ")

    assert index.check(f"{UNRELATED[1]} {copied}") == NGRAM_OVERLAP


def test_a_12_word_overlap_is_not_contamination_at_13(index: EvalIndex) -> None:
    for item in EVAL_ITEMS:
        planted = f"{FILLER} {span(item, 4, 12)} {UNRELATED[0]}"

        assert index.check(planted) is None
        assert EvalIndex.build([(item, None)], DecontaminationConfig(ngram_words=12)).check(
            planted
        ) == (NGRAM_OVERLAP)


def test_unrelated_texts_pass(index: EvalIndex) -> None:
    for text in [*UNRELATED, FILLER, f"{FILLER} {UNRELATED[2]}", ""]:
        assert index.check(text, None) is None


def test_a_short_eval_item_matches_only_the_same_short_text() -> None:
    question = "Is my data stored in the EU?"
    index = EvalIndex.build(
        [(question, None)], DecontaminationConfig(near_duplicate_threshold=None)
    )

    assert index.check("is my data stored in the EU") == NGRAM_OVERLAP
    assert index.check(f"Hello, I have a question. {question} Thanks!") is None
    assert index.check("Is my data stored in the US?") is None


def test_the_index_holds_exactly_the_eval_grams(index: EvalIndex) -> None:
    assert index.eval_items == len(EVAL_ITEMS)
    assert index.gram_count == len(set().union(*(ngrams(item) for item in EVAL_ITEMS)))
    assert index.signature_count == len(EVAL_ITEMS)
    assert index.nbytes >= 8 * index.gram_count + 512 * index.signature_count


def test_template_grams_shared_by_many_eval_items_can_be_ignored() -> None:
    """A fixed system prompt in every item would otherwise exclude every train item."""
    system = (
        "You are the billing assistant of Acme Corporation and you answer politely and briefly."
    )
    evals = [(f"{system} {item}", None) for item in EVAL_ITEMS]
    train_clean = f"{system} {UNRELATED[0]}"
    train_copy = f"{system} {span(EVAL_ITEMS[1], 2, 13)}"
    strict = EvalIndex.build(evals, DecontaminationConfig(near_duplicate_threshold=None))
    tolerant = EvalIndex.build(
        evals, DecontaminationConfig(near_duplicate_threshold=None, max_eval_items_per_gram=2)
    )

    assert strict.check(train_clean) == NGRAM_OVERLAP
    assert tolerant.check(train_clean) is None
    assert tolerant.check(train_copy) == NGRAM_OVERLAP
    assert tolerant.gram_count < strict.gram_count


# near-duplicates


def test_a_lightly_edited_copy_is_caught_as_a_near_duplicate() -> None:
    rng = random.Random(5)
    evals = [vocabulary_text(rng, REPLY_WORDS) for _ in range(50)]
    only_near = EvalIndex.build(
        ((text, None) for text in evals), DecontaminationConfig(ngram_words=None)
    )
    both = EvalIndex.build((text, None) for text in evals)

    for item in evals[:10]:
        edited = substitute(item, REPLY_WORDS // 2, "edited")

        assert only_near.check(edited) == NEAR_DUPLICATE
        assert both.check(edited) == NGRAM_OVERLAP  # the stronger evidence is reported
    assert only_near.check(vocabulary_text(rng, REPLY_WORDS)) is None
    assert only_near.check(f"{span(evals[0], 0, 40)} {vocabulary_text(rng, 80)}") is None


def test_a_short_near_duplicate_without_a_shared_n_gram_is_caught_by_its_signature() -> None:
    """Every 13-gram of RENEWAL covers its seventh word: only the signatures can see it."""
    index = EvalIndex.build([(RENEWAL, None)])
    edited = RENEWAL.replace("4417", "4418")

    assert not ngrams(edited) & ngrams(RENEWAL)
    assert index.check(edited) == NEAR_DUPLICATE


def test_precomputed_signatures_are_the_ones_compared() -> None:
    """Stored signatures cover an item's fields (prompt, completion), not the text given for
    n-grams: a near-duplicate pair is found through them even when those texts differ."""
    rng = random.Random(9)
    prompt, completion = "Why was I charged twice?", vocabulary_text(rng, REPLY_WORDS)
    edited = substitute(completion, 10, "edited")
    index = EvalIndex.build(
        [(completion, minhash_signature(prompt, completion))],
        DecontaminationConfig(ngram_words=None),
    )

    assert index.check("unrelated", minhash_signature(prompt, edited)) == NEAR_DUPLICATE
    assert index.check(edited, minhash_signature("Another question?", UNRELATED[0])) is None
    assert index.check(edited) is None  # signed as one field: not comparable with two


def test_wordless_and_repeated_eval_items_stay_out_of_the_signature_index() -> None:
    index = EvalIndex.build([("", None), ("  ", None), (EVAL_ITEMS[0], None)] * 3)

    assert index.eval_items == 9
    assert index.signature_count == 1
    assert index.check("") is None
    assert index.check(EVAL_ITEMS[0]) == NGRAM_OVERLAP


def test_signatures_of_the_wrong_size_are_refused(index: EvalIndex) -> None:
    with pytest.raises(InvalidInput, match="512 bytes"):
        index.check(UNRELATED[0], b"\x00" * 16)


# configuration and the batch API


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ngram_words": 0}, "at least one word"),
        ({"near_duplicate_threshold": 0.0}, r"\(0, 1\]"),
        ({"near_duplicate_threshold": 1.5}, r"\(0, 1\]"),
        ({"ngram_words": None, "near_duplicate_threshold": None}, "needs the n-gram or"),
        ({"max_eval_items_per_gram": 0}, "at least 1"),
    ],
)
def test_bad_configurations_are_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        DecontaminationConfig(**settings)  # type: ignore[arg-type]


def test_an_empty_eval_set_contaminates_nothing() -> None:
    index = EvalIndex.build([])

    assert index.eval_items == index.gram_count == index.signature_count == 0
    assert list(index.contaminated([(1, EVAL_ITEMS[0], None), (2, "", None)])) == []


def test_the_batch_api_equals_the_single_api_across_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(11)
    index = EvalIndex.build((text, None) for text in [*EVAL_ITEMS, RENEWAL])
    texts = [
        *EVAL_ITEMS,
        RENEWAL.replace("4417", "4418"),
        RENEWAL.replace("Friday", "Monday"),
        *UNRELATED,
        "",
        "Is my data stored in the EU?",
        f"{FILLER} {span(EVAL_ITEMS[2], 3, 13)}",
        f"{FILLER} {span(EVAL_ITEMS[2], 3, 12)}",
        substitute(EVAL_ITEMS[1], 4, "edited"),
        *(vocabulary_text(rng, rng.randrange(1, 40)) for _ in range(20)),
    ]
    rng.shuffle(texts)
    items = [
        (f"key{position}", text, minhash_signature(text) if position % 2 else None)
        for position, text in enumerate(texts)
    ]
    monkeypatch.setattr(decontamination, "BATCH_ITEMS", 4)

    singles = [(key, index.check(text, signature)) for key, text, signature in items]
    batched = list(index.contaminated(items))

    assert batched == [(key, reason) for key, reason in singles if reason is not None]
    assert [reason for _, reason in batched].count(NGRAM_OVERLAP) == len(EVAL_ITEMS) + 2
    assert [reason for _, reason in batched].count(NEAR_DUPLICATE) == 2

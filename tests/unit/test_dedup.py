"""MinHash signatures and the banding that finds near-duplicates, without a database."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from flywheel.errors import InvalidInput
from flywheel.signals.dedup import (
    NUM_PERM,
    SIGNATURE_BYTES,
    band_shape,
    estimated_jaccard,
    find_near_duplicates,
    minhash_signature,
    shingle_hashes,
)

REPLY = (
    "Hi Maria, thanks for reaching out about your invoice. I checked your account and the "
    "duplicate charge of 42 dollars on March 3 was a pre-authorisation hold that our payment "
    "provider releases within five business days. You do not need to do anything; if it is "
    "still there next week, reply to this message and I will refund it manually. Sorry for "
    "the worry, and have a good day."
)
OTHER = (
    "To reset your password, open the sign-in page, choose 'Forgot password' and follow the "
    "link we email you. The link expires after thirty minutes, so use it soon. If no email "
    "arrives, check your spam folder or ask your workspace admin to resend the invitation."
)


def similarity(left: str, right: str) -> float:
    return estimated_jaccard(minhash_signature(left), minhash_signature(right))


def exact_jaccard(left: str, right: str) -> float:
    a, b = shingle_hashes(left), shingle_hashes(right)
    return len(a & b) / len(a | b)


def random_text(rng: random.Random, words: int) -> list[str]:
    vocabulary = [f"w{index}" for index in range(2_000)]
    return [rng.choice(vocabulary) for _ in range(words)]


def test_a_signature_is_128_minima_and_identical_texts_sign_identically() -> None:
    signature = minhash_signature(REPLY)

    assert len(signature) == SIGNATURE_BYTES == NUM_PERM * 4
    assert minhash_signature(REPLY) == signature
    assert estimated_jaccard(signature, signature) == 1.0


def test_signatures_are_the_same_in_another_process() -> None:
    """Signatures are stored and compared across workers: no per-process hash salt."""
    code = (
        "import sys; from flywheel.signals.dedup import minhash_signature; "
        "sys.stdout.write(minhash_signature(sys.argv[1]).hex())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", code, REPLY], capture_output=True, text=True, env=env, check=True
    )

    assert bytes.fromhex(result.stdout) == minhash_signature(REPLY)


def test_case_spacing_and_punctuation_do_not_change_a_long_text() -> None:
    variant = REPLY.upper().replace(" ", "   \n").replace(",", "").replace(".", " .")

    assert minhash_signature(variant) == minhash_signature(REPLY)


def test_small_edits_keep_the_estimate_high() -> None:
    edited = REPLY.replace("Maria", "John").replace("five", "ten")

    assert similarity(REPLY, edited) >= 0.75
    assert abs(similarity(REPLY, edited) - exact_jaccard(REPLY, edited)) < 0.1


def test_unrelated_texts_look_unrelated() -> None:
    assert similarity(REPLY, OTHER) < 0.05


def test_the_estimate_tracks_the_exact_jaccard_index() -> None:
    """Over many pairs the estimator is unbiased: its mean error is far below one slot's worth
    of noise (the standard error of a single estimate is about 0.04 at J = 0.5)."""
    rng = random.Random(7)
    errors = []
    for _ in range(60):
        words = random_text(rng, 150)
        edited = list(words)
        for _ in range(rng.randint(1, 25)):
            edited[rng.randrange(len(edited))] = f"x{rng.randrange(10**6)}"
        left, right = " ".join(words), " ".join(edited)
        errors.append(similarity(left, right) - exact_jaccard(left, right))

    assert abs(float(np.mean(errors))) < 0.02
    assert float(np.mean(np.abs(errors))) < 0.05


def test_short_texts_are_compared_by_characters() -> None:
    """A typo changes most word 3-grams of a short text, but few character 5-grams."""
    typo = similarity("Please refund order 12345 today", "please refund order 12346 today")
    reply = similarity("Yes, refund it", "No, refund it")

    assert typo > 0.6
    assert reply < typo


def test_fields_are_compared_in_place() -> None:
    """A preference pair with chosen and rejected swapped is the opposite signal."""
    prompt = "My invoice shows a duplicate charge, what happened?"
    pair = minhash_signature(prompt, REPLY, OTHER)

    assert minhash_signature(prompt, REPLY, OTHER) == pair
    assert estimated_jaccard(pair, minhash_signature(prompt, OTHER, REPLY)) < 0.2


def test_a_text_without_words_still_signs() -> None:
    assert minhash_signature("") == minhash_signature("   ") == b"\xff" * SIGNATURE_BYTES
    assert minhash_signature("?!") != minhash_signature("")


def test_signatures_of_the_wrong_size_are_refused() -> None:
    with pytest.raises(InvalidInput, match="512 bytes"):
        estimated_jaccard(b"\x00" * 16, minhash_signature(REPLY))


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.85, 0.95])
def test_banding_catches_pairs_at_the_threshold(threshold: float) -> None:
    bands, rows = band_shape(threshold)

    assert bands * rows <= NUM_PERM
    assert 1 - (1 - threshold**rows) ** bands >= 0.99
    # One row more per band would miss more than 1% of them.
    fewer = NUM_PERM // (rows + 1)
    assert 1 - (1 - threshold ** (rows + 1)) ** fewer < 0.99


def signatures(*texts: str) -> np.ndarray:
    return np.stack([np.frombuffer(minhash_signature(text), "<u4") for text in texts])


def links(
    texts: list[str],
    *,
    new: list[bool] | None = None,
    canonical: list[bool] | None = None,
    partitions: list[int] | None = None,
) -> list[tuple[int, int]]:
    count = len(texts)
    return find_near_duplicates(
        signatures(*texts),
        is_new=np.array(new if new is not None else [True] * count),
        is_canonical=np.array(canonical if canonical is not None else [True] * count),
        partitions=None if partitions is None else np.array(partitions, dtype=np.uint64),
    )


def near(text: str, *edits: tuple[str, str]) -> str:
    for old, new in edits:
        text = text.replace(old, new)
    return text


def test_near_duplicates_link_to_the_earliest_and_distinct_texts_stay_apart() -> None:
    texts = [REPLY, OTHER, near(REPLY, ("Maria", "Jo")), near(OTHER, ("thirty", "sixty")), REPLY]

    assert links(texts) == [(2, 0), (3, 1), (4, 0)]


def test_a_chain_of_edits_is_matched_against_the_canonical_only() -> None:
    """0 ~ 1 ~ 2 but 0 !~ 2: 2 does not ride on 1 into 0's cluster, it starts its own."""
    words = random_text(random.Random(3), 250)
    chain = [words]
    for step in range(2):
        edited = list(chain[-1])
        for index in range(4):
            edited[30 + 50 * index + 10 * step] = f"edit{step}-{index}"
        chain.append(edited)
    texts = [" ".join(version) for version in chain]
    assert similarity(texts[0], texts[1]) >= 0.85
    assert similarity(texts[1], texts[2]) >= 0.85
    assert similarity(texts[0], texts[2]) < 0.85

    assert links(texts) == [(1, 0)]


def test_old_rows_keep_their_links_and_only_new_rows_are_linked() -> None:
    texts = [REPLY, near(REPLY, ("Maria", "Jo")), near(REPLY, ("five", "ten"))]

    # Row 1 was linked elsewhere earlier (not canonical); row 0 is an old canonical.
    assert links(texts, new=[False, False, True], canonical=[True, False, True]) == [(2, 0)]
    # Nothing new: nothing linked, even though rows 0 and 1 match.
    assert links(texts, new=[False, False, False]) == []


def test_a_new_row_older_than_its_match_does_not_link_to_it() -> None:
    """Rows come in (created_at, id) order; a link only ever points backwards."""
    texts = [near(REPLY, ("Maria", "Jo")), REPLY]

    assert links(texts, new=[True, False]) == []


def test_partitions_never_match_each_other() -> None:
    texts = [REPLY, near(REPLY, ("Maria", "Jo")), near(REPLY, ("five", "ten"))]

    assert links(texts, partitions=[1, 2, 1]) == [(2, 0)]

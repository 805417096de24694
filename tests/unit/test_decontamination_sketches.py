"""Stored sketches (flywheel.datasets.sketches) give decontamination the same answers as the
texts they were made from, and an extended eval index equals one built at once."""

from __future__ import annotations

import random

import pytest

from flywheel.datasets.decontamination import DecontaminationConfig, EvalIndex
from flywheel.datasets.sketches import sketch_texts
from flywheel.errors import InvalidInput

CONFIGS = [
    DecontaminationConfig(),
    DecontaminationConfig(ngram_words=5, near_duplicate_threshold=None),
    DecontaminationConfig(ngram_words=None, near_duplicate_threshold=0.7),
    DecontaminationConfig(ngram_words=13, max_eval_items_per_gram=2),
]


def corpus(seed: int) -> tuple[list[str], list[str]]:
    """Eval texts, and train texts that quote, lightly edit, repeat or ignore them (short,
    empty and punctuation-only ones included)."""
    rng = random.Random(seed)

    def text(count: int) -> str:
        return " ".join(f"w{rng.randrange(300)}" for _ in range(count))

    evaluation = [text(rng.choice([3, 12, 20, 60])) for _ in range(40)] + ["", "?!", "ok"]
    train = [text(rng.choice([3, 13, 40])) for _ in range(60)] + ["", "?!", "OK."]
    for source in rng.sample(evaluation[:40], 15):
        words = source.split()
        if rng.random() < 0.5 and words:
            words[rng.randrange(len(words))] = "edited"
        train.append(f"{text(5)} {' '.join(words)} {text(5)}")
    return evaluation, train


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_sketches_decontaminate_as_the_texts_do(seed: int, config: DecontaminationConfig) -> None:
    evaluation, train = corpus(seed)
    n = config.ngram_words or 13
    by_text = EvalIndex.build(((text, None) for text in evaluation), config)
    by_sketch = EvalIndex.from_sketches(sketch_texts(evaluation, n), config)
    expected = list(by_text.contaminated((i, text, None) for i, text in enumerate(train)))
    sketched = sketch_texts(train, n)
    found = list(by_sketch.contaminated_sketches((i, *sketch) for i, sketch in enumerate(sketched)))
    assert found == expected
    assert expected  # the corpus has contamination of some kind to find
    assert (by_sketch.gram_count, by_sketch.signature_count) == (
        by_text.gram_count,
        by_text.signature_count,
    )


@pytest.mark.parametrize("seed", [1, 2])
def test_a_merged_index_equals_one_built_at_once(seed: int) -> None:
    evaluation, train = corpus(seed)
    config = DecontaminationConfig()
    sketches = sketch_texts(evaluation, 13)
    whole = EvalIndex.from_sketches(sketches, config)
    grown = EvalIndex.from_sketches(sketches[:25], config).merged(
        [EvalIndex.from_sketches(sketches[25:], config)]
    )
    checked = [(i, *sketch) for i, sketch in enumerate(sketch_texts(train, 13))]
    assert list(grown.contaminated_sketches(checked)) == list(whole.contaminated_sketches(checked))
    assert (grown.gram_count, grown.signature_count) == (whole.gram_count, whole.signature_count)


@pytest.mark.parametrize("seed", [1, 2])
def test_kept_parts_read_back_and_merged_equal_an_index_built_at_once(seed: int) -> None:
    """What a domain keeps between processes (flywheel.datasets.kept_index): each part's
    index as bytes, read back as one index, answers as the index of all the items does."""
    evaluation, train = corpus(seed)
    config = DecontaminationConfig()
    sketches = sketch_texts(evaluation, 13)
    whole = EvalIndex.from_sketches(sketches, config)
    parts = [sketches[:10], sketches[10:30], sketches[30:]]
    kept = [(*EvalIndex.from_sketches(part, config).hashes(), len(part)) for part in parts]
    merged = EvalIndex.of_hashes(kept, config)
    assert EvalIndex.of_hashes([kept[0]], config).hashes() == tuple(kept[0][:2])
    checked = [(i, *sketch) for i, sketch in enumerate(sketch_texts(train, 13))]
    assert list(merged.contaminated_sketches(checked)) == list(whole.contaminated_sketches(checked))
    assert merged.hashes() == whole.hashes()
    assert merged.eval_items == whole.eval_items


def test_only_indexes_of_the_same_settings_merge() -> None:
    sketches = sketch_texts(["one two three four five six"], 13)
    ours = EvalIndex.from_sketches(sketches, DecontaminationConfig())
    other = EvalIndex.from_sketches(sketches, DecontaminationConfig(ngram_words=5))
    with pytest.raises(InvalidInput, match="same settings"):
        ours.merged([other])

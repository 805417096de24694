"""Decontamination: keep train candidates that overlap a frozen eval set out of training.

An eval score means little if the model trained on the eval items, so a dataset build drops
every train candidate that shares an n-gram with, or is a near-duplicate of, any item of the
domain's frozen eval sets. Two independent checks, each catching what the other misses:

- n-gram overlap (GPT-3, Brown et al. 2020, appendix C: 13-grams): a train text that
  contains any n consecutive words of an eval item, however much else it says. Catches an
  eval answer pasted into a longer conversation; misses a copy with an edit every few words.
- near-duplicate (MinHash, `flywheel.signals.dedup`): estimated Jaccard of the shingle sets
  at or above the threshold. Catches a lightly edited copy; misses a short quote in a long
  text. It compares signatures, so both sides must be signed over the same fields: the
  stored `minhash` of one signal table against another's (field tags differ) never matches.

A third check runs before these two, in the build (`flywheel.datasets.service`): the exact
prompt key (`flywheel.datasets.items`), which catches a train item asking an eval item's
question with another answer however short the question, where n-grams see one short gram
and MinHash a small shingle set dominated by the differing answers.

Normalisation, before words are cut (as GPT-3 did, "ignoring all punctuation, whitespace,
and casing"; EleutherAI's lm-evaluation-harness janitor deletes `string.punctuation` and
lowercases, and this is its Unicode generalisation):

1. NFKC (full-width letters, ligatures, non-breaking spaces become their plain forms);
2. `str.casefold()` (lowercase, and "ß" is "ss");
3. every punctuation (Unicode category P*), symbol (S*) and invisible format character (Cf:
   soft hyphen, zero-width space and joiners, BOM) is *deleted*, not replaced by a space:
   "don't" is "dont" and "e-mail" is "email", so one side's hyphen or apostrophe does not
   change a word; the ASCII characters deleted are exactly `string.punctuation`;
4. words are the runs between whitespace (`str.split()`).

A text of n words or more yields its n-grams; a shorter one yields one gram of all its
words, and an empty one none. So a short eval item (fewer than n words) only matches a train
text that normalises to exactly the same words, never a longer text that quotes it: a
five-word question in a long conversation is too weak a signal to exclude it. If a domain's
eval items are short, lower n (GPT-3 used the 5th percentile of item length, at least 8).

Words are hashed to 64 bits (blake2b, stable across processes) and an n-gram to the
polynomial hash of its word hashes, so an index holds about 10 bytes per distinct gram (the
hash and a bit filter) instead of tuples of strings, and a batch of train texts is checked
with a handful of numpy calls.
Distinct grams collide with probability about 2^-64 per pair; a collision can only exclude
an item, never let one through.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import sys
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from flywheel.datasets.hashsets import Buckets, HashSet, distinct, run_starts
from flywheel.errors import InvalidInput
from flywheel.signals.dedup import (
    DEFAULT_THRESHOLD,
    NUM_PERM,
    SIGNATURE_BYTES,
    band_shape,
    minhash_signatures,
)

DEFAULT_NGRAM_WORDS = 13
NGRAM_OVERLAP: Final = "ngram_overlap"
NEAR_DUPLICATE: Final = "near_duplicate"
Reason = Literal["ngram_overlap", "near_duplicate"]
BATCH_ITEMS = 4_096
"""Items checked per numpy pass: enough to amortise the calls, few enough that a batch's
arrays stay a few MB (about 330k grams for 80-word texts)."""
VERIFY_PAIRS = 1 << 15
"""Candidate (train, eval) signature pairs compared at once: 2 x 16 MiB of minima."""

Key = TypeVar("Key")
Uint64s = npt.NDArray[np.uint64]
Uint32s = npt.NDArray[np.uint32]
Intps = npt.NDArray[np.intp]
BoolArray = npt.NDArray[np.bool_]

_MASK = (1 << 64) - 1
_POLY = 0x100000001B3  # FNV-1a 64 prime: odd, so every step of the rolling hash is a bijection
_SHORT_TAG = 0x9E3779B97F4A7C15  # times the word count: a short text's gram is apart from n-grams
_NO_SHINGLES = b"\xff" * SIGNATURE_BYTES  # dedup's signature of a text without words
_rng = np.random.default_rng(0xDEC0_7A11)
_BAND_SALTS = _rng.integers(0, 2**63, NUM_PERM, dtype=np.uint64)
_WORD_HASH_CACHE_SIZE = 1 << 17  # about 20 MB

_SEPARATOR_WORD = "\x00"
_SEPARATOR = f" {_SEPARATOR_WORD} "


@dataclass(frozen=True)
class DecontaminationConfig:
    """How a build decontaminates; stored in the version's recipe so it can be rebuilt."""

    ngram_words: int | None = field(
        default=DEFAULT_NGRAM_WORDS,
        metadata={"help": "n of the n-gram overlap check (GPT-3: 13); None turns it off."},
    )
    near_duplicate_threshold: float | None = field(
        default=DEFAULT_THRESHOLD,
        metadata={"help": "Estimated Jaccard that makes a near-duplicate; None turns it off."},
    )
    max_eval_items_per_gram: int | None = field(
        default=None,
        metadata={
            "help": "Ignore eval n-grams found in more than this many eval items: template "
            "text (a fixed system prompt, a form's boilerplate) that every train item shares "
            "too would otherwise exclude them all. None keeps every gram."
        },
    )

    def __post_init__(self) -> None:
        if self.ngram_words is None and self.near_duplicate_threshold is None:
            raise InvalidInput("decontamination needs the n-gram or the near-duplicate check")
        if self.ngram_words is not None and self.ngram_words < 1:
            raise InvalidInput(f"n-grams have at least one word, not {self.ngram_words}")
        threshold = self.near_duplicate_threshold
        if threshold is not None and not 0 < threshold <= 1:
            raise InvalidInput(f"the near-duplicate threshold is in (0, 1], not {threshold}")
        if self.max_eval_items_per_gram is not None and self.max_eval_items_per_gram < 1:
            raise InvalidInput("max_eval_items_per_gram is at least 1")


def ngrams(text: str, n: int = DEFAULT_NGRAM_WORDS) -> set[int]:
    """The hashed word n-grams of `text`, after the normalisation the module describes; a text
    of fewer than n words yields one gram of all its words, an empty text none."""
    if n < 1:
        raise InvalidInput(f"n-grams have at least one word, not {n}")
    grams, _ = batch_grams([text], n)
    return set(grams.tolist())


def batch_grams(texts: Sequence[str], n: int) -> tuple[Uint64s, Intps]:
    """Every text's grams, concatenated, and the index of the text each belongs to."""
    words, ends = _batch_words(texts)
    counts = np.diff(ends, prepend=0)
    long_grams, long_owners = _window_grams(words, ends, n)
    short = np.flatnonzero((counts > 0) & (counts < n))
    short_grams = np.fromiter(
        (_short_gram(words[ends[i] - counts[i] : ends[i]]) for i in short.tolist()),
        np.uint64,
        short.size,
    )
    return np.concatenate([long_grams, short_grams]), np.concatenate([long_owners, short])


def _batch_words(texts: Sequence[str]) -> tuple[Uint64s, Intps]:
    """The word hashes of all texts, concatenated, and where each text's words end.

    The batch is normalised and split as one string, texts apart by a NUL word (removed from
    the texts themselves first): one C call each instead of one per text, which halves the
    cost. Normalising the whole equals normalising each text, as no NFKC composition spans
    the " NUL " between them.
    """
    joined = _SEPARATOR.join(text.replace(_SEPARATOR_WORD, "") for text in texts)
    hashes = _hash_words(_normalised(joined).split())
    is_separator = hashes == 0
    words = hashes[~is_separator]
    separators = np.flatnonzero(is_separator)
    return words, np.append(separators - np.arange(separators.size), words.size)


def _normalised(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold().translate(_deleted_characters())


@functools.cache
def _deleted_characters() -> dict[int, None]:
    """Translation table deleting punctuation, symbols and format characters (built once,
    on first use: scanning every code point takes about 0.2 s)."""
    return {
        point: None
        for point in range(sys.maxunicode + 1)
        if unicodedata.category(chr(point))[0] in "PS" or unicodedata.category(chr(point)) == "Cf"
    }


def _hash_words(tokens: list[str]) -> Uint64s:
    return np.fromiter(map(_word_hashes.__getitem__, tokens), np.uint64, len(tokens))


class _WordHashes(dict[str, int]):
    """Memo of a pure function, word -> stable 64-bit odd hash (0 is the separator's).

    Vocabularies are Zipfian, so most words hit, and a hit costs one C-level dict lookup;
    a miss is hashed in `__missing__`, inside the same `map`. Python's `hash()` is salted per
    process, so it will not do for hashes compared across processes. Bounded: cleared when
    full. Safe across threads: a word cleared away by another thread is hashed again.
    """

    def __missing__(self, word: str) -> int:
        if word == _SEPARATOR_WORD:
            return 0
        if len(self) > _WORD_HASH_CACHE_SIZE:
            self.clear()
            self[_SEPARATOR_WORD] = 0
        # surrogatepass: text decoded from JSON may hold lone surrogates; they still hash.
        digest = hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        value = self[word] = int.from_bytes(digest, "little") | 1
        return value


_word_hashes = _WordHashes({_SEPARATOR_WORD: 0})


def _window_grams(words: Uint64s, ends: Intps, n: int) -> tuple[Uint64s, Intps]:
    """Polynomial hashes of the n-word windows lying inside one text, over the concatenation
    of all texts' words (one numpy pass per word of the window, whatever the batch size)."""
    count = words.size - n + 1
    if count <= 0:
        return np.empty(0, np.uint64), np.empty(0, np.intp)
    grams = words[:count].copy()
    for offset in range(1, n):
        grams *= np.uint64(_POLY)  # array products wrap silently; scalar ones would warn
        grams += words[offset : offset + count]
    starts = np.arange(count)
    owners = np.searchsorted(ends, starts, side="right")  # texts are [ends[i - 1], ends[i])
    inside = starts + n <= ends[owners]
    return grams[inside], owners[inside]


def _short_gram(words: Uint64s) -> int:
    """The same polynomial over all of a short text's words, tagged with their count."""
    value = 0
    for word in words.tolist():
        value = (value * _POLY + word) & _MASK
    return value ^ ((_SHORT_TAG * words.size) & _MASK)


def _band_keys(signatures: Uint32s, threshold: float) -> Uint64s:
    """(rows, bands) 64-bit bucket keys, salted per band so all bands share one sorted index."""
    bands, rows = band_shape(threshold)
    columns = signatures[:, : bands * rows].astype(np.uint64).reshape(-1, bands, rows)
    keys = columns[:, :, 0].copy()
    for offset in range(1, rows):
        keys *= np.uint64(_POLY)
        keys += columns[:, :, offset]
    keys ^= _BAND_SALTS[:bands]
    return keys


def _signature_matrix(signatures: Sequence[bytes]) -> Uint32s:
    for signature in signatures:
        if len(signature) != SIGNATURE_BYTES:
            raise InvalidInput(f"a signature has {SIGNATURE_BYTES} bytes, not {len(signature)}")
    flat = np.frombuffer(b"".join(signatures), dtype="<u4").astype(np.uint32)
    return flat.reshape(len(signatures), NUM_PERM)


def _signed(texts: Sequence[str], signatures: Sequence[bytes | None]) -> list[bytes]:
    """The given signatures, and one signed from the text (as a single field) where none is."""
    missing = [index for index, signature in enumerate(signatures) if signature is None]
    computed = iter(minhash_signatures([[texts[index]] for index in missing]))
    return [next(computed) if signature is None else signature for signature in signatures]


Row = TypeVar("Row")


def _batches(items: Iterable[Row]) -> Iterator[list[Row]]:
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, BATCH_ITEMS)):
        yield batch


class EvalIndex:
    """The frozen eval items of a domain, indexed once, against which train candidates are
    checked. Holds the eval n-gram hashes (sorted, behind a bit filter) and the eval MinHash
    signatures with their LSH buckets: about 10 bytes per distinct gram and 1 KB per signed
    item, so some 160 MB for 100k eval items of 80 words. Build it with `build`."""

    def __init__(
        self,
        config: DecontaminationConfig,
        *,
        grams: Uint64s,
        signatures: Uint32s,
        eval_items: int,
    ) -> None:
        self.config = config
        self.eval_items = eval_items
        self._grams = HashSet.of(grams)
        self._signatures = signatures
        threshold = config.near_duplicate_threshold
        self._min_equal = 0 if threshold is None else math.ceil(threshold * NUM_PERM - 1e-9)
        self._buckets = Buckets.of(
            _band_keys(signatures, threshold)
            if threshold is not None
            else np.empty((0, 1), np.uint64)
        )

    @classmethod
    def build(
        cls,
        items: Iterable[tuple[str, bytes | None]],
        config: DecontaminationConfig | None = None,
    ) -> EvalIndex:
        """Index eval items given as (text, MinHash signature or None), streamed in batches.

        An item without a signature is signed from its text as one field (see the module
        note: train items must then be signed the same way). Items without words are left
        out of the near-duplicate index: an empty text resembles nothing.
        """
        config = config or DecontaminationConfig()
        gram_batches: list[Uint64s] = []
        signatures: list[bytes] = []
        eval_items = 0
        for batch in _batches(((None, text, signature) for text, signature in items)):
            _, texts, given = zip(*batch, strict=True)
            if config.ngram_words is not None:
                gram_batches.append(
                    _eval_grams(texts, config.ngram_words, config.max_eval_items_per_gram)
                )
            if config.near_duplicate_threshold is not None:
                signatures += _signed(texts, given)
            eval_items += len(batch)
        return cls(
            config,
            grams=_kept_grams(gram_batches, config.max_eval_items_per_gram),
            signatures=_distinct_signatures(signatures),
            eval_items=eval_items,
        )

    @classmethod
    def from_sketches(
        cls, sketches: Sequence[tuple[bytes, bytes]], config: DecontaminationConfig
    ) -> EvalIndex:
        """The index `build` makes of the texts these (grams, signature) sketches came from
        (`flywheel.datasets.sketches`: grams distinct per item, so counts count items)."""
        arrays = [np.frombuffer(grams, dtype="<u8").astype(np.uint64) for grams, _ in sketches]
        is_ngram = config.ngram_words is not None and bool(arrays)
        is_near = config.near_duplicate_threshold is not None
        return cls(
            config,
            grams=_kept_grams(
                [np.concatenate(arrays)] if is_ngram else [], config.max_eval_items_per_gram
            ),
            signatures=_distinct_signatures(
                [signature for _, signature in sketches] if is_near else []
            ),
            eval_items=len(sketches),
        )

    def merged(self, others: Sequence[EvalIndex]) -> EvalIndex:
        """The index of this one's eval items and the others' (disjoint items, the same
        config): equal to indexing them all at once, without a per-gram item limit."""
        if self.config.max_eval_items_per_gram is not None:
            raise InvalidInput("an index that drops frequent grams cannot be extended")
        if any(other.config != self.config for other in others):
            raise InvalidInput("only indexes made with the same settings can be merged")
        indexes = (self, *others)
        return EvalIndex._union(
            self.config,
            [index._grams.values for index in indexes],
            [row.tobytes() for index in indexes for row in index._signatures],
            sum(index.eval_items for index in indexes),
        )

    def hashes(self) -> tuple[bytes, bytes]:
        """The index as bytes: its distinct n-gram hashes (sorted, little-endian uint64) and
        distinct signatures (little-endian uint32 rows), which `of_hashes` reads back."""
        return (
            self._grams.values.astype("<u8").tobytes(),
            self._signatures.astype("<u4").tobytes(),
        )

    @classmethod
    def of_hashes(
        cls, parts: Sequence[tuple[bytes, bytes, int]], config: DecontaminationConfig
    ) -> EvalIndex:
        """The index of the eval items of these parts, each the bytes `hashes` gave for an
        index of its items (disjoint) and their count: the one index of them all."""
        grams = [np.frombuffer(part[0], dtype="<u8").astype(np.uint64) for part in parts]
        eval_items = sum(part[2] for part in parts)
        if len(parts) == 1:  # distinct and sorted already
            signatures = np.frombuffer(parts[0][1], dtype="<u4").astype(np.uint32)
            return cls(
                config,
                grams=grams[0],
                signatures=signatures.reshape(-1, NUM_PERM),
                eval_items=eval_items,
            )
        size = SIGNATURE_BYTES
        rows = [part[1][i : i + size] for part in parts for i in range(0, len(part[1]), size)]
        return cls._union(config, grams, rows, eval_items)

    @classmethod
    def _union(
        cls,
        config: DecontaminationConfig,
        grams: Sequence[Uint64s],
        signatures: list[bytes],
        eval_items: int,
    ) -> EvalIndex:
        """The index of several indexes' sorted distinct grams and signature rows: a stable
        sort (timsort) merges the sorted runs of grams."""
        merged = np.sort(np.concatenate(grams), kind="stable")
        return cls(
            config,
            grams=merged[run_starts(merged)],
            signatures=_distinct_signatures(signatures),
            eval_items=eval_items,
        )

    @property
    def nbytes(self) -> int:
        """Memory held by the index's arrays (what a 100k-item eval set costs to keep)."""
        return self._grams.nbytes + self._signatures.nbytes + self._buckets.nbytes

    @property
    def gram_count(self) -> int:
        return int(self._grams.values.size)

    @property
    def signature_count(self) -> int:
        return int(self._signatures.shape[0])

    def check(self, text: str, signature: bytes | None = None) -> Reason | None:
        """Why this train item is contaminated ("ngram_overlap" before "near_duplicate"), or
        None if it is clean. One item at a time costs a few numpy calls: prefer
        `contaminated` for many."""
        return next((reason for _, reason in self.contaminated([(None, text, signature)])), None)

    def contaminated(
        self, items: Iterable[tuple[Key, str, bytes | None]]
    ) -> Iterator[tuple[Key, Reason]]:
        """(key, reason) for each contaminated train item, in input order; clean items are
        skipped. Items are (key, text, signature or None), streamed in batches of
        `BATCH_ITEMS`, so a million candidates never sit in memory at once here.

        An item without a signature is signed from its text when the near-duplicate check
        is on: about 17k items/s, slower than both checks together (`python -m
        bench.decontamination`). Stored signatures save that where both sides come from one
        table. An item with an n-gram overlap is not signed.
        """
        for batch in _batches(items):
            keys, texts, signatures = zip(*batch, strict=True)
            overlaps = self._ngram_overlaps(texts)
            near = self._near_duplicates(texts, signatures, skip=overlaps)
            for index in np.flatnonzero(overlaps | near).tolist():
                yield keys[index], NGRAM_OVERLAP if overlaps[index] else NEAR_DUPLICATE

    def contaminated_sketches(
        self, items: Iterable[tuple[Key, bytes, bytes]]
    ) -> Iterator[tuple[Key, Reason]]:
        """`contaminated` for items given as (key, stored grams, stored signature), as
        `flywheel.datasets.sketches` makes them from the same texts: the same answers
        without normalising, hashing or signing anything."""
        for batch in _batches(items):
            keys, grams, signatures = zip(*batch, strict=True)
            overlaps = np.zeros(len(keys), dtype=bool)
            if self.config.ngram_words is not None and self._grams.values.size:
                # One array of the batch's grams (per item, two numpy calls cost more than
                # the lookups: 0.4 s of 233k drawn rows at 1M items)
                hashes = np.frombuffer(b"".join(grams), dtype="<u8").astype(np.uint64)
                sizes = [len(blob) // 8 for blob in grams]
                owners = np.repeat(np.arange(len(sizes)), sizes)
                overlaps[owners[self._grams.positions(hashes) >= 0]] = True
            near = self._near_duplicates([""] * len(keys), signatures, skip=overlaps)
            for index in np.flatnonzero(overlaps | near).tolist():
                yield keys[index], NGRAM_OVERLAP if overlaps[index] else NEAR_DUPLICATE

    def _ngram_overlaps(self, texts: Sequence[str]) -> BoolArray:
        overlaps = np.zeros(len(texts), dtype=bool)
        if self.config.ngram_words is not None and self._grams.values.size:
            grams, owners = batch_grams(texts, self.config.ngram_words)
            overlaps[owners[self._grams.positions(grams) >= 0]] = True
        return overlaps

    def _near_duplicates(
        self, texts: Sequence[str], signatures: Sequence[bytes | None], *, skip: BoolArray
    ) -> BoolArray:
        """Items whose signature agrees with an eval signature on at least `threshold` of its
        minima; those in `skip` (already contaminated) are neither signed nor looked up."""
        near = np.zeros(len(texts), dtype=bool)
        threshold = self.config.near_duplicate_threshold
        todo = np.flatnonzero(~skip)
        if threshold is None or self._signatures.shape[0] == 0 or todo.size == 0:
            return near
        indices = todo.tolist()
        signed = _signed([texts[i] for i in indices], [signatures[i] for i in indices])
        matrix = _signature_matrix(signed)
        queries, members = self._buckets.candidates(_band_keys(matrix, threshold))
        for start in range(0, queries.size, VERIFY_PAIRS):
            chunk = slice(start, start + VERIFY_PAIRS)
            equal = (matrix[queries[chunk]] == self._signatures[members[chunk]]).sum(axis=1)
            near[todo[queries[chunk][equal >= self._min_equal]]] = True
        return near


def _eval_grams(texts: Sequence[str], n: int, max_items: int | None) -> Uint64s:
    """A batch's eval grams: distinct overall, or, when frequent grams are to be dropped, one
    per (item, gram), so that counting them later counts items."""
    grams, owners = batch_grams(texts, n)
    if max_items is None:
        return distinct(grams)
    order = np.lexsort((grams, owners))
    grams, owners = grams[order], owners[order]
    first = np.ones(grams.size, dtype=bool)
    first[1:] = (grams[1:] != grams[:-1]) | (owners[1:] != owners[:-1])
    return grams[first]


def _kept_grams(batches: list[Uint64s], max_items: int | None) -> Uint64s:
    """The sorted distinct grams of all batches, less those in more than `max_items` items."""
    if not batches:
        return np.empty(0, np.uint64)
    grams = np.sort(np.concatenate(batches))
    starts = run_starts(grams)
    if max_items is None:
        return grams[starts]
    counts = np.diff(starts, append=grams.size)
    return grams[starts[counts <= max_items]]


def _distinct_signatures(signatures: list[bytes]) -> Uint32s:
    """The eval signature matrix without repeats (a repeated item would crowd its buckets)
    and without the signature of a wordless text."""
    distinct = sorted(set(signatures) - {_NO_SHINGLES})
    return _signature_matrix(distinct)

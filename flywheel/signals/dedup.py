"""Near-duplicate detection: MinHash signatures, LSH banding, links to the canonical item.

Exact duplicates never reach a table (the per-domain content-hash unique constraint refuses
them). Near-duplicates do, and are kept: the near-duplicate pass links each one to the
earliest item of its cluster through `duplicate_of_id`, so datasets can count, weigh or drop
them knowingly instead of losing them silently at ingest.

Contract with the writers: a row enters with `minhash` NULL. The pass signs it and links it in
the caller's transaction, so a stored signature means "already through the pass"; ingest must
not sign rows itself, or they would never be compared.

Signatures are 128 32-bit minima (512 bytes, little-endian). Each permutation is the affine
map `a*h + b mod 2^32` (odd `a`) applied to a 64-bit shingle hash pre-mixed with the
MurmurHash3 finalizer: the scheme datasketch 2 defaults to ("affine32"), vectorised here over
batches of documents because datasketch hashes each shingle in a Python loop (about 3x
slower, see `python -m bench.near_duplicates`). Changing the shingling or the seeds
invalidates stored signatures: a migration must then set `minhash` back to NULL.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import numpy.typing as npt
from sqlalchemy import Table, bindparam, null, select, text, update
from sqlalchemy.orm import Session

from flywheel.db import Base, domain_lock
from flywheel.errors import InvalidInput, InvalidState
from flywheel.signals.models import LabeledCompletion, PreferencePair, SftExample, VerifiableTask

NUM_PERM = 128
SIGNATURE_BYTES = NUM_PERM * 4
WORD_SHINGLE = 3
CHAR_SHINGLE = 5
SHORT_TEXT_WORDS = 20
"""Below this many words a text is shingled by characters: a one-word edit in a ten-word
text changes most of its word 3-grams, but only a few of its character 5-grams."""
CHUNK_ROWS = 5_000
"""Rows read per round trip: texts are streamed, never all held at once."""
WRITE_ROWS = 1_000
"""Rows written per UPDATE. Small enough that PostgreSQL joins them to the table through its
primary key: at 5,000 it hashed them against a scan of the whole table, once per UPDATE,
which made the pass quadratic (on 100k rows it took twice as long)."""
DEFAULT_THRESHOLD = 0.85

Uint64s = npt.NDArray[np.uint64]
Uint32s = npt.NDArray[np.uint32]
BoolArray = npt.NDArray[np.bool_]

_rng = np.random.default_rng(0x5EED_F1A7)
_A = (_rng.integers(0, 2**32, NUM_PERM, dtype=np.uint64) | np.uint64(1)).astype(np.uint32)
_B = _rng.integers(0, 2**32, NUM_PERM, dtype=np.uint64).astype(np.uint32)
_POLY = np.uint64(0x100000001B3)  # FNV-1a 64 prime: odd, so each window step is a bijection
_BAND_SALTS = _rng.integers(0, 2**63, NUM_PERM, dtype=np.uint64)
_FIELD_TAG = 0x9E3779B97F4A7C15
_EMPTY = b"\xff" * SIGNATURE_BYTES
_WORD = re.compile(r"\w+")
_TOKEN_HASH_CACHE_SIZE = 1 << 16  # about 10 MB
_BATCH_SHINGLES = 1 << 14  # 8 MiB of uint32 products per batch

# Memo of a pure function (token -> 64-bit hash): vocabularies are Zipfian, so most tokens are
# hits and hashing costs a dict lookup. Bounded: cleared when full. Safe across threads: a
# token cleared away by another thread is hashed again, never missed.
_token_hashes: dict[str, int] = {}


def minhash_signature(*fields: str) -> bytes:
    """The MinHash signature of an item's text fields (e.g. prompt, chosen, rejected).

    Text is NFKC-normalised, lowercased and split on whitespace. A field of `SHORT_TEXT_WORDS`
    words or more is shingled into word 3-grams, punctuation dropped (a reworded sentence end
    is not a new text); a shorter one into character 5-grams of its whitespace-collapsed text,
    punctuation kept (in five words, "x + 1" and "x - 1" differ). Shingles are tagged with their
    field's position, so (prompt, A, B) and (prompt, B, A) do not match.
    """
    return minhash_signatures([fields])[0]


def minhash_signatures(items: Sequence[Sequence[str]]) -> list[bytes]:
    """`minhash_signature` of many items: the permutations run over a batch of items per numpy
    call rather than one item per call, which about halves the cost of signing."""
    shingles = [_item_shingles(fields) for fields in items]
    signatures = [_EMPTY] * len(shingles)
    for index, hashes in enumerate(shingles):
        if hashes.size > _BATCH_SHINGLES:
            signatures[index] = _long_item_minima(hashes)
    short = [index for index, hashes in enumerate(shingles) if 0 < hashes.size <= _BATCH_SHINGLES]
    for batch in _batches(short, shingles):
        minima = _batch_minima([shingles[index] for index in batch])
        for index, signature in zip(batch, minima, strict=True):
            signatures[index] = signature
    return signatures


def estimated_jaccard(left: bytes, right: bytes) -> float:
    """The share of equal minima: an unbiased estimate of the shingle sets' Jaccard index."""
    return float(np.mean(_signature_array(left) == _signature_array(right)))


def shingle_hashes(*fields: str) -> set[int]:
    """The tagged shingle hashes a signature is computed from, for exact Jaccard checks."""
    return {
        int(value)
        for index, field in enumerate(fields)
        for value in _tag(_field_shingles(field), index)
    }


def _signature_array(signature: bytes) -> Uint32s:
    if len(signature) != SIGNATURE_BYTES:
        raise InvalidInput(f"a signature has {SIGNATURE_BYTES} bytes, not {len(signature)}")
    return np.frombuffer(signature, dtype="<u4").astype(np.uint32)


def _item_shingles(fields: Sequence[str]) -> Uint64s:
    parts = [_tag(_field_shingles(field), index) for index, field in enumerate(fields)]
    return np.concatenate(parts) if parts else np.empty(0, np.uint64)


def _field_shingles(field: str) -> Uint64s:
    tokens = unicodedata.normalize("NFKC", field).lower().split()
    if len(tokens) >= SHORT_TEXT_WORDS:
        words = _hash_tokens(tokens)
        words = words[words != 0]
        if len(words) >= SHORT_TEXT_WORDS:
            return _windows(words, WORD_SHINGLE)
    characters = np.frombuffer(" ".join(tokens).encode("utf-32-le"), dtype=np.uint32)
    return _windows(characters.astype(np.uint64), CHAR_SHINGLE)


def _hash_tokens(tokens: list[str]) -> Uint64s:
    try:
        return np.fromiter(map(_token_hashes.__getitem__, tokens), np.uint64, len(tokens))
    except KeyError:
        if len(_token_hashes) > _TOKEN_HASH_CACHE_SIZE:
            _token_hashes.clear()
        return np.fromiter(map(_cached_token_hash, tokens), np.uint64, len(tokens))


def _cached_token_hash(token: str) -> int:
    value = _token_hashes.get(token)
    if value is None:
        value = _token_hashes[token] = _token_hash(token)
    return value


def _token_hash(token: str) -> int:
    """A stable 64-bit hash of the token's word characters; 0 for a token of punctuation only.

    Python's `hash()` is salted per process, and signatures are stored, so it will not do.
    """
    word = "".join(_WORD.findall(token))
    return _stable_hash(word) | 1 if word else 0


def _stable_hash(value: str) -> int:
    return int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "little")


def _windows(values: Uint64s, width: int) -> Uint64s:
    """Polynomial hashes of every run of `width` consecutive values (the whole, if shorter),
    in a new array."""
    if values.size == 0:
        return values
    width = min(width, values.size)
    count = values.size - width + 1
    hashes = values[:count].copy()
    for offset in range(1, width):
        hashes *= _POLY
        hashes += values[offset : offset + count]
    return hashes


def _tag(hashes: Uint64s, field_index: int) -> Uint64s:
    """Mark the (fresh) shingle array with its field, in place."""
    # Python ints: numpy warns when a scalar product wraps, array products wrap silently.
    hashes ^= np.uint64(_FIELD_TAG * (field_index + 1) % 2**64)
    return hashes


def _batches(indices: list[int], shingles: list[Uint64s]) -> Iterator[list[int]]:
    """Consecutive items holding about `_BATCH_SHINGLES` shingles: a bounded product matrix."""
    batch: list[int] = []
    size = 0
    for index in indices:
        batch.append(index)
        size += shingles[index].size
        if size >= _BATCH_SHINGLES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _batch_minima(shingles: list[Uint64s]) -> list[bytes]:
    """Each item's minima, from one product matrix reduced per item along its contiguous axis
    (`reduceat` along the other axis is several times slower)."""
    offsets = np.zeros(len(shingles), np.intp)
    np.cumsum([hashes.size for hashes in shingles[:-1]], out=offsets[1:])
    minima = np.minimum.reduceat(_permute(np.concatenate(shingles)), offsets, axis=1)
    return [row.tobytes() for row in np.ascontiguousarray(minima.T, dtype="<u4")]


def _long_item_minima(hashes: Uint64s) -> bytes:
    minima = np.full(NUM_PERM, np.iinfo(np.uint32).max, dtype=np.uint32)
    for start in range(0, hashes.size, _BATCH_SHINGLES):
        np.minimum(
            minima, _permute(hashes[start : start + _BATCH_SHINGLES]).min(axis=1), out=minima
        )
    return minima.astype("<u4").tobytes()


def _permute(hashes: Uint64s) -> Uint32s:
    """(NUM_PERM, n): every permutation applied to every shingle hash."""
    mixed = _fmix64(hashes)
    folded = (mixed ^ (mixed >> np.uint64(32))).astype(np.uint32)
    permuted: Uint32s = np.multiply.outer(_A, folded)
    permuted += _B[:, None]
    return permuted


def _fmix64(hashes: Uint64s) -> Uint64s:
    """MurmurHash3's finalizer: a bijection that spreads polynomial hashes over all 64 bits."""
    hashes = hashes ^ (hashes >> np.uint64(33))
    hashes *= np.uint64(0xFF51AFD7ED558CCD)
    hashes ^= hashes >> np.uint64(33)
    hashes *= np.uint64(0xC4CEB9FE1A85EC53)
    hashes ^= hashes >> np.uint64(33)
    return hashes


def band_shape(threshold: float, num_perm: int = NUM_PERM) -> tuple[int, int]:
    """(bands, rows per band): the most selective banding under which a pair exactly at the
    threshold still shares a bucket 99% of the time. Selective keeps the candidate lists short;
    the false positives it lets through are removed by comparing signatures."""
    for rows in range(num_perm, 0, -1):
        bands = num_perm // rows
        if 1 - (1 - threshold**rows) ** bands >= 0.99:
            return bands, rows
    return num_perm, 1


def find_near_duplicates(
    signatures: Uint32s,
    *,
    is_new: BoolArray,
    is_canonical: BoolArray,
    partitions: Uint64s | None = None,
    threshold: float = DEFAULT_THRESHOLD,
) -> list[tuple[int, int]]:
    """(row, canonical row) links for the new rows; rows come in (created_at, id) order.

    A new row links to the earliest canonical row before it whose estimated Jaccard reaches
    `threshold`, or else becomes canonical itself. Only canonical rows are matched, so a chain
    of small edits cannot drift away from its canonical item. Rows of different `partitions`
    never match. Old rows keep their links: a new row older than an old near-duplicate does
    not take its place as canonical.
    """
    bands, rows = band_shape(threshold)
    keys = _band_keys(signatures, bands, rows, partitions)
    shared = _shared_buckets(keys, is_new)
    in_play = np.flatnonzero(shared.any(axis=1))
    row_buckets = _bucket_lists(keys[in_play], shared[in_play])
    canonical_members: dict[int, list[int]] = {}  # bucket -> canonical positions, in order
    min_equal = math.ceil(threshold * signatures.shape[1] - 1e-9)
    links = []
    for position, row in enumerate(in_play.tolist()):
        if is_new[row]:
            found = {
                member
                for bucket in row_buckets[position]
                for member in canonical_members.get(bucket, ())
            }
            canonical = _earliest_match(signatures, row, in_play[sorted(found)], min_equal)
            if canonical is not None:
                links.append((row, canonical))
                continue
        elif not is_canonical[row]:
            continue
        for bucket in row_buckets[position]:
            canonical_members.setdefault(bucket, []).append(position)
    return links


def _band_keys(signatures: Uint32s, bands: int, rows: int, partitions: Uint64s | None) -> Uint64s:
    """One 64-bit bucket key per row and band, salted by band (buckets of all bands share one
    dict) and by partition (rows of different partitions never share a bucket)."""
    columns = signatures[:, : bands * rows].astype(np.uint64).reshape(-1, bands, rows)
    keys = columns[:, :, 0].copy()
    for offset in range(1, rows):
        keys *= _POLY
        keys += columns[:, :, offset]
    keys ^= _BAND_SALTS[:bands]
    if partitions is not None:
        keys ^= partitions[:, None]
    return keys


def _shared_buckets(keys: Uint64s, is_new: BoolArray) -> BoolArray:
    """(rows, bands): whether the row's bucket in that band also holds another row, one of
    them new. Only these buckets can yield a link; in a large domain most rows have none, and
    the others one or two, which keeps the loop in `find_near_duplicates` short."""
    shared = np.zeros(keys.shape, dtype=bool)
    for band in range(keys.shape[1]):
        _, inverse, counts = np.unique(keys[:, band], return_inverse=True, return_counts=True)
        has_new = np.zeros(counts.size, dtype=bool)
        has_new[inverse[is_new]] = True
        shared[:, band] = (counts > 1)[inverse] & has_new[inverse]
    return shared


def _bucket_lists(keys: Uint64s, shared: BoolArray) -> list[list[int]]:
    """Per row, the keys of its shared buckets, as Python ints (dict keys)."""
    flat = keys[shared].tolist()
    ends = np.cumsum(shared.sum(axis=1)).tolist()
    return [flat[start:end] for start, end in zip([0, *ends][:-1], ends, strict=True)]


def _earliest_match(
    signatures: Uint32s, row: int, candidates: npt.NDArray[np.intp], min_equal: int
) -> int | None:
    if candidates.size == 0:
        return None
    equal = (signatures[candidates] == signatures[row]).sum(axis=1)
    matches = candidates[equal >= min_equal]
    return int(matches[0]) if matches.size else None


@dataclass(frozen=True)
class _SignalTable:
    """A signal table and the columns whose text identifies its items, in field order."""

    name: str
    text_columns: tuple[str, ...]
    partition_column: str | None = None

    @property
    def table(self) -> Table:
        return Base.metadata.tables[self.name]


# Labeled completions are partitioned by label: the same answer marked good and marked bad is
# a contradiction to surface, not a duplicate to fold. A task is its prompt (what a model
# sees): two tasks a model cannot tell apart leak across a train/eval split whatever tests
# they hide.
_SIGNAL_TABLES = (
    # Tool calls and tools come last: a text-only item's fields (and signature) are as they were.
    _SignalTable(
        SftExample.__tablename__, ("messages", "completion", "completion_tool_calls", "tools")
    ),
    _SignalTable(
        PreferencePair.__tablename__,
        ("messages", "chosen", "rejected", "chosen_tool_calls", "rejected_tool_calls", "tools"),
    ),
    _SignalTable(
        LabeledCompletion.__tablename__,
        ("messages", "completion", "completion_tool_calls", "tools"),
        "is_desirable",
    ),
    _SignalTable(VerifiableTask.__tablename__, ("prompt",)),
)


def link_near_duplicates(
    session: Session, *, domain_id: uuid.UUID, threshold: float = DEFAULT_THRESHOLD
) -> dict[str, int]:
    """Sign the domain's unsigned signal rows and link each new near-duplicate to its canonical
    item; per table, how many rows were newly linked.

    Unsigned rows' texts are streamed once and signed; the domain's stored signatures (512
    bytes a row) are then read for the banding, and each new row's signature and link are
    written in bulk UPDATEs, in the caller's transaction (never committed here). With nothing
    unsigned, nothing else is read and nothing is linked.
    """
    if not 0 < threshold <= 1:
        raise InvalidInput(f"the near-duplicate threshold is in (0, 1], not {threshold}")
    domain_lock(session, domain_id, "near-duplicates")
    return {spec.name: _link_table(session, spec, domain_id, threshold) for spec in _SIGNAL_TABLES}


# A signed row: (created_at, id, duplicate_of_id, minhash, partition, is_new).
_Signed = tuple[datetime, uuid.UUID, uuid.UUID | None, bytes, object, bool]


def _link_table(
    session: Session, spec: _SignalTable, domain_id: uuid.UUID, threshold: float
) -> int:
    fresh = _sign_unsigned(session, spec, domain_id)
    if not fresh:
        return 0
    rows = sorted(fresh + _stored(session, spec, domain_id), key=lambda row: (row[0], row[1]))
    _, ids, duplicate_of, minhashes, partitions, is_new = zip(*rows, strict=True)
    links = find_near_duplicates(
        _signature_matrix(minhashes),
        is_new=np.array(is_new, dtype=bool),
        is_canonical=np.array([link is None for link in duplicate_of], dtype=bool),
        partitions=_partition_salts(partitions) if spec.partition_column else None,
        threshold=threshold,
    )
    canonical = {ids[row]: ids[match] for row, match in links}
    _write_signed(session, spec.table, [(row[1], row[3], canonical.get(row[1])) for row in fresh])
    return len(links)


def _sign_unsigned(session: Session, spec: _SignalTable, domain_id: uuid.UUID) -> list[_Signed]:
    """Sign the unsigned rows, streaming their texts in one pass (a server-side cursor on
    PostgreSQL). Nothing is written yet: each signature goes in later with its row's link."""
    table = spec.table
    partition = null() if spec.partition_column is None else table.c[spec.partition_column]
    query = (
        select(table.c.created_at, table.c.id, partition)
        .add_columns(*(table.c[name] for name in spec.text_columns))
        .where(table.c.domain_id == domain_id, table.c.minhash.is_(None))
        .execution_options(yield_per=CHUNK_ROWS)
    )
    signed: list[_Signed] = []
    with session.execute(query) as result:
        for chunk in result.partitions():
            signatures = minhash_signatures([[_field_text(v) for v in row[3:]] for row in chunk])
            for (created_at, row_id, group, *_), signature in zip(chunk, signatures, strict=True):
                signed.append((created_at, row_id, None, signature, group, True))
    return signed


def _stored(session: Session, spec: _SignalTable, domain_id: uuid.UUID) -> list[_Signed]:
    table = spec.table
    partition = null() if spec.partition_column is None else table.c[spec.partition_column]
    query = select(
        table.c.created_at, table.c.id, table.c.duplicate_of_id, table.c.minhash, partition
    ).where(table.c.domain_id == domain_id, table.c.minhash.is_not(None))
    return [(*row, False) for row in session.execute(query)]


def _field_text(value: object) -> str:
    """A column's text: strings as they are, a message list as its contents, one per line
    (with its tool calls' names and arguments), tool calls and tools as their names (and a
    call's arguments)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(filter(None, (_entry_text(entry) for entry in value)))
    return ""


def _entry_text(entry: object) -> str:
    """A message, a tool call or a tool definition as text."""
    if not isinstance(entry, dict):
        return ""
    function = entry.get("function")
    if isinstance(function, dict):  # a tool call (name, arguments) or a tool (name)
        parts = (function.get("name"), function.get("arguments"))
        return " ".join(part for part in parts if isinstance(part, str))
    content = entry.get("content")
    lines = [content] if isinstance(content, str) else []
    calls = entry.get("tool_calls")
    if isinstance(calls, list):
        lines.append(_field_text(calls))
    return "\n".join(lines)


def _signature_matrix(minhashes: Sequence[bytes]) -> Uint32s:
    if any(len(minhash) != SIGNATURE_BYTES for minhash in minhashes):
        raise InvalidState(
            f"stored near-duplicate signatures must have {SIGNATURE_BYTES} bytes; "
            "set minhash to NULL to have them recomputed"
        )
    flat = np.frombuffer(b"".join(minhashes), dtype="<u4").astype(np.uint32)
    return flat.reshape(len(minhashes), NUM_PERM)


def _partition_salts(values: Sequence[object]) -> Uint64s:
    salts = {value: _stable_hash(repr(value)) for value in set(values)}
    return np.fromiter((salts[value] for value in values), np.uint64, len(values))


def _write_signed(
    session: Session, table: Table, rows: list[tuple[uuid.UUID, bytes, uuid.UUID | None]]
) -> None:
    """Store each new row's signature and link, in bulk; ORM objects of those rows that the
    session holds are expired, so they reload what was written behind their back."""
    by_id = update(table).where(table.c.id == bindparam("row_id"))
    statement = by_id.values(minhash=bindparam("row_minhash"), duplicate_of_id=bindparam("link"))
    for start in range(0, len(rows), WRITE_ROWS):
        chunk = rows[start : start + WRITE_ROWS]
        if session.get_bind().dialect.name == "postgresql":
            _update_from_arrays(session, table, chunk)
        else:
            params = [{"row_id": i, "row_minhash": m, "link": d} for i, m, d in chunk]
            session.execute(statement, params)
    ids = {row_id for row_id, _, _ in rows}
    for key in list(session.identity_map.keys()):
        model, primary_key, _ = key
        if getattr(model, "__table__", None) is table and primary_key[0] in ids:
            session.expire(session.identity_map[key], ["minhash", "duplicate_of_id"])


def _update_from_arrays(
    session: Session, table: Table, rows: list[tuple[uuid.UUID, bytes, uuid.UUID | None]]
) -> None:
    """One UPDATE joined to unnested array parameters: no statement per row, and no VALUES
    list of 3n parameters to parse."""
    statement = text(
        f"UPDATE {table.name} AS t SET minhash = v.minhash, duplicate_of_id = v.link "
        "FROM unnest(CAST(:ids AS uuid[]), CAST(:minhashes AS bytea[]), CAST(:links AS uuid[])) "
        "AS v(id, minhash, link) WHERE t.id = v.id"
    )
    ids, minhashes, links = (list(column) for column in zip(*rows, strict=True))
    session.execute(statement, {"ids": ids, "minhashes": minhashes, "links": links})

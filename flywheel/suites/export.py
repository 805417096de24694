"""A suite's one training export: every member's own train split, combined.

Each member's dataset version is exported as usual (`trl`, train split only, under
`members/<domain>/`); its rows are then merged into one export the trainer reads like any
other (`finetune.data.open_export`), each row tagged with its `domain`:

- weights: a member's rows share its suite weight: a row's weight is its own weight, over the
  sum of its member's row weights in that file, times the member's share of the suite's
  weights, times the file's row count (so the mean stays about 1). A trainer drawing rows by
  `weight` (finetune.sampling) then draws each member's share of the rows, whatever the
  members' sizes, and within a member as its own version would.
- order: under `easy_first`, tasks by measured pass rate (their `difficulty`), highest first,
  across every member (unknown difficulty after the known ones, other rows last); ties, and
  every row under `none`, by a hash of the row and its domain, so members interleave. The
  manifest's `recipe.curriculum` tells the trainer to keep the order.

The manifest's `suite` section records each member's weight, dataset version and row counts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from flywheel.datasets.models import DatasetVersion
from flywheel.datasets.reader import export_dataset_version
from flywheel.errors import InvalidState
from flywheel.suites.service import LoadedSuite

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class _Row:
    domain: str
    row: dict[str, Any]
    line: str


def export_suite(
    session: Session,
    loaded: LoadedSuite,
    versions: dict[str, DatasetVersion],
    out_dir: Path,
) -> dict[str, Any]:
    """Write the suite's combined train export to `out_dir` (members' own exports beside it,
    in `<out_dir>/../members/`); the manifest's `suite` section."""
    members_dir = out_dir.parent / "members"
    rows: dict[str, list[_Row]] = defaultdict(list)  # "train/sft.jsonl" -> rows
    for member in loaded.members:
        name = member.domain.name
        target = members_dir / name
        if not (target / MANIFEST).is_file():
            export_dataset_version(session, versions[name], name, target, "trl", splits=("train",))
        for relative in json.loads((target / MANIFEST).read_text())["export"]["files"]:
            rows[relative] += _read(target / relative, name)
    shares = _shares(loaded)
    files = {relative: _weighted(found, shares) for relative, found in rows.items()}
    if not files:
        raise InvalidState(f"suite {loaded.name!r}: no member has a train item")
    ordered = {rel: _ordered(found, loaded.suite.curriculum) for rel, found in files.items()}
    section = _section(loaded, versions, ordered)
    _write(out_dir, ordered, loaded, section)
    return section


def _read(path: Path, domain: str) -> list[_Row]:
    found = []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                row = json.loads(line)
                found.append(_Row(domain, row, line.strip()))
    return found


def _shares(loaded: LoadedSuite) -> dict[str, float]:
    total = sum(member.weight for member in loaded.members)
    return {member.domain.name: member.weight / total for member in loaded.members}


def _weighted(rows: list[_Row], shares: dict[str, float]) -> list[_Row]:
    """Each row's weight scaled so its member draws its share of the file (see the module)."""
    totals: dict[str, float] = defaultdict(float)
    for entry in rows:
        totals[entry.domain] += _weight(entry.row)
    present = sum(shares[domain] for domain, total in totals.items() if total > 0)
    weighted = []
    for entry in rows:
        total = totals[entry.domain]
        scale = shares[entry.domain] / present / total * len(rows) if total > 0 else 0.0
        row = entry.row | {"weight": _weight(entry.row) * scale, "domain": entry.domain}
        weighted.append(_Row(entry.domain, row, entry.line))
    return weighted


def _weight(row: dict[str, Any]) -> float:
    weight = row.get("weight")
    return 1.0 if weight is None else float(weight)


def _ordered(rows: list[_Row], curriculum: str) -> list[_Row]:
    def tie(entry: _Row) -> str:
        return hashlib.sha256(f"{entry.domain}\n{entry.line}".encode()).hexdigest()

    if curriculum != "easy_first":
        return sorted(rows, key=tie)
    return sorted(rows, key=lambda entry: (_ease(entry.row), tie(entry)))


def _ease(row: dict[str, Any]) -> float:
    """Sort key: a task's pass rate, negated (easiest first); unknown after, non-tasks last."""
    if "difficulty" not in row:
        return 2.0
    difficulty = row["difficulty"]
    return -float(difficulty) if difficulty is not None else 1.0


def _section(
    loaded: LoadedSuite, versions: dict[str, DatasetVersion], ordered: dict[str, list[_Row]]
) -> dict[str, Any]:
    members = {}
    for member in loaded.members:
        name = member.domain.name
        counts = {rel: sum(r.domain == name for r in rows) for rel, rows in ordered.items()}
        members[name] = {
            "weight": member.weight,
            "domain_id": str(member.domain.id),
            "dataset_version_id": str(versions[name].id),
            "dataset_version": versions[name].version,
            "rows": counts,
        }
    return {"id": str(loaded.suite.id), "name": loaded.name,
            "curriculum": loaded.suite.curriculum, "members": members}  # fmt: skip


def _write(
    out_dir: Path, ordered: dict[str, list[_Row]], loaded: LoadedSuite, section: dict[str, Any]
) -> None:
    """The files and the manifest (last) in a staging directory, renamed into place."""
    if (out_dir / MANIFEST).is_file():
        shutil.rmtree(out_dir)  # a resumed run re-exports: the members may have changed
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    files: dict[str, dict[str, Any]] = {}
    digest = hashlib.sha256()
    for relative, rows in sorted(ordered.items()):
        data = "".join(json.dumps(e.row, ensure_ascii=False, sort_keys=True) + "\n" for e in rows)
        path = staging / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data, encoding="utf-8")
        sha = hashlib.sha256(data.encode()).hexdigest()
        files[relative] = {"rows": len(rows), "bytes": len(data.encode()), "sha256": sha}
        digest.update(f"{relative}\t{sha}\n".encode())
    manifest = {
        "domain": loaded.name,
        "dataset_version_id": None,
        "manifest_sha256": digest.hexdigest(),
        "recipe": {"curriculum": loaded.suite.curriculum},
        "suite": section,
        "export": {"format": "trl", "files": files, "skipped": {}, "omitted_kinds": []},
    }
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (staging / MANIFEST).write_text(text, encoding="utf-8")
    os.replace(staging, out_dir)

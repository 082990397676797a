"""Resumable batches: work is split into units (a source video, a clip, a shard), and each finished
unit commits its records and errors in one atomic file. A rerun skips committed units; `finalize` joins
them into the stage's `manifest.jsonl` and `errors.jsonl` in a fixed order, so a run killed at any point
and resumed produces the same files as one that never stopped."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vidforge.data.manifest import read_jsonl, remove_stale_temporaries, stable_id, write_jsonl

MANIFEST = "manifest.jsonl"
ERRORS = "errors.jsonl"
UNITS_DIR = ".units"


class UnitLedger:
    """The committed units of one stage's output directory."""

    def __init__(self, out_dir: str | os.PathLike):
        self.out_dir = Path(out_dir)
        self.units_dir = self.out_dir / UNITS_DIR
        self.units_dir.mkdir(parents=True, exist_ok=True)

    def recover(self) -> int:
        """Clean what a killed run left half-written. Call once before work starts."""
        return remove_stale_temporaries(self.out_dir)

    def _path(self, unit_key: str) -> Path:
        return self.units_dir / f"{stable_id(unit_key)}.jsonl"

    def is_done(self, unit_key: str) -> bool:
        return self._path(unit_key).is_file()

    def commit(
        self, unit_key: str, records: Iterable[dict[str, Any]], errors: Iterable[dict[str, Any]] = ()
    ) -> None:
        """Record a finished unit. Its media files must already be in place (renamed into final names)."""
        lines = [{"kind": "record", "unit": unit_key, "data": r} for r in records]
        lines += [{"kind": "error", "unit": unit_key, "data": e} for e in errors]
        if not lines:
            lines = [{"kind": "empty", "unit": unit_key, "data": {}}]
        write_jsonl(self._path(unit_key), lines)

    def entries(self) -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = []
        for path in sorted(self.units_dir.glob("*.jsonl")):
            lines.extend(read_jsonl(path))
        return lines

    def finalize(self, sort_key: str | None = None) -> tuple[list[dict], list[dict]]:
        """Write manifest.jsonl and errors.jsonl from every committed unit. Records are ordered by their unit
        key (or by `sort_key` when given), so the files do not depend on completion order."""
        entries = sorted(self.entries(), key=lambda e: e["unit"])  # stable: keeps order inside a unit
        records = [e["data"] for e in entries if e["kind"] == "record"]
        if sort_key is not None:
            records.sort(key=lambda r: r.get(sort_key))
        errors = [e["data"] for e in entries if e["kind"] == "error"]
        write_jsonl(self.out_dir / MANIFEST, records)
        write_jsonl(self.out_dir / ERRORS, errors)
        return records, errors

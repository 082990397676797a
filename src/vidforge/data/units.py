"""Resumable batches: work is split into units (a source video, a clip, a shard), and each finished
unit commits its records and errors in one atomic file. A rerun skips committed units; `finalize` joins
them into the stage's `manifest.jsonl` and `errors.jsonl` in a fixed order, so a run killed at any point
and resumed produces the same files as one that never stopped.

A unit that failed for a reason other than its input (a worker died, a file vanished) is committed for
`retry`: its errors are in this run's files, and the next run does it again instead of skipping it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vidforge.data.folder_lock import FolderLock, subfolder
from vidforge.data.manifest import read_jsonl, remove_stale_temporaries, stable_id, write_jsonl

MANIFEST = "manifest.jsonl"
ERRORS = "errors.jsonl"
UNITS_DIR = ".units"


class UnitLedger:
    """The committed units of one stage's output directory."""

    def __init__(self, out_dir: str | os.PathLike):
        self.out_dir = Path(out_dir)
        self.units_dir = subfolder(self.out_dir, UNITS_DIR)
        self.lock: FolderLock | None = None

    def recover(self) -> int:
        """Take the folder's lock (`FolderBusy`, exit 2, if another process writes it), then clean what a
        killed run left half-written. Call once before work starts; the lock is held while this ledger
        lives (or until `release`)."""
        self.lock = self.lock or FolderLock(self.out_dir)
        return remove_stale_temporaries(self.out_dir)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _path(self, unit_key: str, retry: bool = False) -> Path:
        return self.units_dir / f"{stable_id(unit_key)}{'.retry' if retry else ''}.jsonl"

    def is_done(self, unit_key: str) -> bool:
        return self._path(unit_key).is_file()

    def commit(
        self,
        unit_key: str,
        records: Iterable[dict[str, Any]],
        errors: Iterable[dict[str, Any]] = (),
        retry: bool = False,
    ) -> None:
        """Record a finished unit. Its media files must already be in place (renamed into final names).
        `retry`: it failed for a reason other than its input, so `is_done` stays false for the next run."""
        lines = [{"kind": "record", "unit": unit_key, "data": r} for r in records]
        lines += [{"kind": "error", "unit": unit_key, "data": e} for e in errors]
        if not lines:
            lines = [{"kind": "empty", "unit": unit_key, "data": {}}]
        # One file a unit, the latest attempt's; killed between these two lines, the unit is simply redone.
        self._path(unit_key, not retry).unlink(missing_ok=True)
        write_jsonl(self._path(unit_key, retry), lines)

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

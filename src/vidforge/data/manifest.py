"""Records between stages: JSON Lines files written atomically, and deterministic ids.

A file appears complete or not at all (`vidforge.files`, the one writer), so a killed run never leaves
half a manifest for the next stage to read."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from typing import Any

# the writer is vidforge.files; its names stay importable from here, where the stages import them
from vidforge.files import TMP_MARK as TMP_MARK
from vidforge.files import atomic_file, write_text
from vidforge.files import atomic_path as atomic_path
from vidforge.files import remove_stale_temporaries as remove_stale_temporaries


def write_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> int:
    """Write records atomically, one JSON object a line. Returns how many were written."""
    count = 0
    with atomic_file(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
            count += 1
    return count


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a JSON Lines file; a malformed line is an error naming the file and line."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{number}: not a JSON record ({err.msg})") from None
    return records


def stable_id(*parts: Any, length: int = 16) -> str:
    """A short hex id that depends only on `parts` (e.g. source path, start frame, end frame), so reruns
    produce the same ids and never duplicate."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).hexdigest()
    return digest[:length]

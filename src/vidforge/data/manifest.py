"""Records between stages: JSON Lines files written atomically, and deterministic ids.

A file appears complete or not at all: it is written under a temporary name beside its target and
renamed over it (rename within one directory is atomic on POSIX), so a killed run never leaves half a
manifest for the next stage to read."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TMP_MARK = ".tmp-"


@contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `target`; rename it to `target` if the block succeeds, delete it if
    not. The temporary name keeps the suffix so libraries that pick a format by extension still work."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.stem}{TMP_MARK}{os.getpid()}{target.suffix}")
    tmp.unlink(missing_ok=True)  # a link planted at the predictable name is removed, not written through
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> int:
    """Write records atomically, one JSON object a line. Returns how many were written."""
    count = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
            count += 1
    return count


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


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


def remove_stale_temporaries(directory: str | os.PathLike) -> int:
    """Delete leftovers of a killed run (files carrying the temporary mark). Returns how many."""
    removed = 0
    for path in Path(directory).rglob(f"*{TMP_MARK}*"):
        if path.is_file():
            path.unlink()
            removed += 1
    return removed

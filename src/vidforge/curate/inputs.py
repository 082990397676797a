"""Expanding `vidforge clip INPUT...` into a list of sources: files, directories (recursive, by
extension), glob patterns, list files (.txt / .csv with a `path` column) and fsspec URLs."""

from __future__ import annotations

import csv
import glob
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from vidforge.errors import UserInputError
from vidforge.files import read_text

LIST_SUFFIXES = (".txt", ".csv", ".lst")
_GLOB_CHARS = set("*?[")


def is_url(text: str) -> bool:
    return "://" in text and not text.startswith("file://")


def expand_inputs(args: Sequence[str], extensions: Iterable[str]) -> list[str]:
    """Sources in the order given (directories and globs sorted), each once. Local paths become absolute,
    so clip ids do not depend on the working directory. Raises UserInputError for what matches nothing."""
    if not args:
        raise UserInputError("no inputs: pass video files, directories, glob patterns or a list file")
    exts = {e.lower() for e in extensions}
    seen: dict[str, None] = {}
    for arg in args:
        for source in _expand_one(str(arg), exts):
            seen.setdefault(source, None)
    if not seen:
        raise UserInputError(f"no videos found in {' '.join(args)}; check the paths and curation.extensions")
    return list(seen)


def _expand_one(arg: str, exts: set[str]) -> list[str]:
    if arg.startswith("file://"):
        arg = arg[len("file://") :]
    if is_url(arg):
        return _expand_url(arg, exts)
    path = Path(arg).expanduser()
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in exts)
        return [str(p.resolve()) for p in found]
    if path.is_file():
        if path.suffix.lower() in LIST_SUFFIXES:
            return [s for line in read_list_file(path) for s in _expand_one(line, exts)]
        return [str(path.resolve())]
    if _GLOB_CHARS & set(arg):
        matches = sorted(glob.glob(os.path.expanduser(arg), recursive=True))
        if not matches:
            raise UserInputError(f"{arg}: the pattern matches no files; check it (quote it for the shell)")
        return [s for m in matches for s in _expand_one(m, exts)]
    raise UserInputError(f"{arg}: no such file or directory; check the path")


def read_list_file(path: Path) -> list[str]:
    """Paths from a list file: one per line (# comments), or a CSV whose header has a `path` column.
    Relative entries are relative to the list file's folder."""
    text = read_text(path, "the list file")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if lines and path.suffix.lower() == ".csv" and "path" in next(csv.reader([lines[0]])):
        entries = [row["path"] for row in csv.DictReader(lines) if row.get("path")]
    else:
        entries = lines
    return [e if is_url(e) or os.path.isabs(e) else str(path.parent / e) for e in entries]


def _expand_url(url: str, exts: set[str]) -> list[str]:
    import fsspec

    fs, _, paths = fsspec.get_fs_token_paths(url)
    if _GLOB_CHARS & set(url) or url.endswith("/"):
        protocol = url.split("://", 1)[0]
        found = paths if _GLOB_CHARS & set(url) else fs.find(paths[0])
        return sorted(f"{protocol}://{p}" for p in found if Path(p).suffix.lower() in exts)
    return [url]

"""Paths that come from data (an index's shard names, a manifest's `media`, a clip id used as a file name)
are untrusted: each must resolve inside the folder it belongs to, or its record is refused with the reason.
A name like `../../evil.tar` or `/etc/passwd` would otherwise read or overwrite any file the user can."""

from __future__ import annotations

import os
from pathlib import Path


class UnsafePath(ValueError):
    """A path from data that leaves the folder it belongs to."""


def inside(root: str | os.PathLike, name: str | os.PathLike, what: str = "path") -> Path:
    """`root / name`, refused unless it stays inside `root` once `..` and symbolic links are resolved."""
    text = os.fspath(name)
    if not text or "\0" in text or os.path.isabs(text):
        raise UnsafePath(f"{what} {text!r} is not a path relative to its folder")
    root = Path(root)
    path = root / text
    base = root.resolve()
    if not path.resolve().is_relative_to(base):
        raise UnsafePath(f"{what} {text!r} resolves outside {root}")
    return path


def plain_name(name: str, what: str = "name") -> str:
    """`name` when it is one file name (no folder part, not `.` or `..`): what an output file is called."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise UnsafePath(f"{what} {name!r} is not a plain file name")
    return name

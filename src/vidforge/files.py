"""The one writer of every file a command outputs, and the one reader of the text files it takes in.

Output folders are shared with whoever else can write there, so nothing planted in one is followed:

- a file appears complete or not at all: it is written under a temporary name beside its target
  (`.NAME.tmp-PID.ext`, the suffix kept for libraries that pick a format by extension) and renamed over
  it; a rename replaces a symbolic link at the final name, it never writes through it;
- the temporary is created here with O_CREAT | O_EXCL | O_NOFOLLOW after whatever had its name is
  removed, so a link planted at that predictable name is neither written through nor truncated;
- the folder a file is written in is refused when it is a symbolic link (`RUN/export` linked out of the
  run put the export wherever it pointed), in one line naming it.

Input text files (a video's caption `.txt`) are read by `read_text_inside`: a symbolic link that leaves
the folder it sits in is refused, so a file outside the input never becomes data, and a file that is not
UTF-8 is one line naming it."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from vidforge.errors import UserInputError

TMP_MARK = ".tmp-"
FINETUNE_TRAIN = "train"
"""A `vidforge finetune` run's train stage: the `vidforge train` run folder inside it (its weights in
export/), where readers of a run's weights look besides the folder itself and its export/."""


def weights_places(path: str | os.PathLike) -> tuple[Path, ...]:
    """Where the weights (a model's export, a LoRA adapter) a user names as `path` are looked for, in order:
    a `vidforge train` run's export/, a `vidforge finetune` run's train stage's export/ (`FINETUNE_TRAIN`),
    the folder itself. Every reader of a run's weights asks here, so a run folder means the same to each."""
    folder = Path(path)
    return folder / "export", folder / FINETUNE_TRAIN / "export", folder


def planted(path: Path, what: str) -> str:
    """The one-line refusal of something planted in a folder a command keeps to."""
    return f"{path} is {what} (a stage keeps to its own folders); remove it and run again"


def output_folder(path: str | os.PathLike, create: bool = True) -> Path:
    """`path`, a folder a command writes in (created if missing, unless `create` is false: a stage
    reading another's output checks it by the same rule); refused in one line when it is a symbolic link
    (it would put the command's files wherever it points) or not a folder."""
    path = Path(path)
    if path.is_symlink():
        raise UserInputError(planted(path, "a symbolic link"))
    if path.exists() and not path.is_dir():
        raise UserInputError(f"{path} is not a folder; remove it and run again")
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def subfolder(folder: str | os.PathLike, name: str, create: bool = True) -> Path:
    """`folder/name`, a folder a stage writes in (`.units`, `clips`, `checkpoints`, `export`), by
    `output_folder`'s rule."""
    return output_folder(Path(folder) / name, create)


def temporary_name(target: Path) -> Path:
    return target.with_name(f".{target.stem}{TMP_MARK}{os.getpid()}{target.suffix}")


def _create(path: Path) -> int:
    path.unlink(missing_ok=True)  # whatever was planted at the predictable name goes, unread
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:  # planted again between the unlink and the open: refuse, follow nothing
        raise UserInputError(planted(path, "recreated while it was being written")) from None


@contextmanager
def atomic_path(target: str | os.PathLike, folder_may_link: bool = False) -> Iterator[Path]:
    """Yield the path of a new, empty temporary file beside `target` (for a library that writes by name:
    safetensors, PyAV, Pillow, fsspec); rename it to `target` if the block succeeds, delete it if not.
    `folder_may_link`: the folder is the user's own setting, not a run's (the shard cache, often a link
    to a larger disk), so it may be a symbolic link; the file in it is still never followed."""
    target = Path(target)
    if not folder_may_link:
        output_folder(target.parent)
    tmp = temporary_name(target)
    os.close(_create(tmp))
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_file(target: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator[IO]:
    """`open(target, mode)` for writing, through a temporary created here (nothing reopens it by name)."""
    if not mode.startswith("w"):
        raise ValueError(f"atomic_file writes a new file: mode {mode!r}")
    target = Path(target)
    output_folder(target.parent)
    tmp = temporary_name(target)
    try:
        with open(_create(tmp), mode, **kwargs) as f:
            yield f
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(target: str | os.PathLike, text: str) -> Path:
    with atomic_file(target, "w", encoding="utf-8") as f:
        f.write(text)
    return Path(target)


def write_bytes(target: str | os.PathLike, data: bytes) -> Path:
    with atomic_file(target, "wb") as f:
        f.write(data)
    return Path(target)


def open_append(target: str | os.PathLike, binary: bool = False) -> IO:
    """A log a command appends to (metrics.jsonl, caption's text-vector logs): opened with O_NOFOLLOW, in a
    folder that is no link; text (UTF-8) unless `binary`."""
    target = Path(target)
    output_folder(target.parent)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as err:
        if target.is_symlink():
            raise UserInputError(planted(target, "a symbolic link")) from None
        raise UserInputError(f"{target}: cannot open it to append ({err.strerror})") from None
    return open(fd, "ab") if binary else open(fd, "a", encoding="utf-8")


def remove_stale_temporaries(directory: str | os.PathLike) -> int:
    """Delete leftovers of a killed run (files carrying the temporary mark). Returns how many."""
    removed = 0
    for path in Path(directory).rglob(f"*{TMP_MARK}*"):
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed += 1
    return removed


def read_text(path: str | os.PathLike, what: str) -> str:
    """The UTF-8 text of the input file `path` (`what` says what it is); one line naming it when it is
    not UTF-8."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8-sig")  # -sig: the byte-order mark an editor may leave
    except UnicodeDecodeError as err:
        raise UserInputError(
            f"{path}: {what} is not UTF-8 (byte {err.start}: {err.reason}); save it as UTF-8"
        ) from None


def read_text_inside(path: str | os.PathLike, folder: str | os.PathLike, what: str) -> str:
    """`read_text` of a file found in the input folder `folder` (a video's caption .txt), refused in one
    line when it is a symbolic link leaving that folder: a file outside the input never becomes data."""
    path = Path(path)
    if path.is_symlink() and not path.resolve().is_relative_to(Path(folder).resolve()):
        raise UserInputError(
            f"{path}: {what} is a symbolic link out of {folder} (to {path.resolve()}); copy the file in"
        )
    return read_text(path, what)


def read_csv(path: str | os.PathLike, what: str) -> tuple[list[str], list[dict[str, str]]]:
    """The header and rows of the CSV input file `path`: any field the file can hold is read (the csv
    module's default limit, 131072 characters, refused a long caption), a file that is not UTF-8 or not
    CSV is one line naming it."""
    path = Path(path)
    text = read_text(path, what)
    csv.field_size_limit(max(csv.field_size_limit(), len(text) + 1))  # the limit is the module's
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        return list(reader.fieldnames or ()), list(reader)
    except csv.Error as err:
        raise UserInputError(f"{path}: {what} is not a CSV file ({err}); fix it") from None

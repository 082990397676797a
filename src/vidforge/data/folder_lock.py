"""One writer per output folder: `FolderLock` holds an exclusive `flock` on `<folder>/.lock` while a stage
writes there. The kernel drops the lock when its holder dies (kill -9 included), so a dead run never
blocks the next one. A second process is refused at once with one line; within one process the lock is
re-entrant (a run retried in the same interpreter, tests), shared until its last holder lets go.

Why it matters: a run's start-up removes what a killed run left half-written (`*.tmp-*`); without the
lock it removed a concurrent run's files in progress, and that run failed its units. On a network
filesystem without flock support the lock cannot be taken; the error says so.

Nothing planted in the folder is followed: `.lock` is opened with O_NOFOLLOW (a symbolic link there made
the lock truncate the file it pointed at and write a pid into it), and the folders a stage writes in
(`subfolder`: `.units`, `clips`, `checkpoints`) are refused when they are symbolic links, so every stage
writes inside its output folder or not at all."""

from __future__ import annotations

import fcntl
import os
import stat
import time
import weakref
from pathlib import Path
from typing import IO

from vidforge.errors import UserInputError
from vidforge.files import planted
from vidforge.files import subfolder as subfolder  # the rule is the writer's; stages import it from here

LOCK = ".lock"

_held: dict[Path, list] = {}  # resolved folder -> [open lock file, holders in this process]


class FolderBusy(UserInputError):
    """Another process is writing the folder."""


class FolderLock:
    """The lock of `folder` (created if missing), taken on construction; `release()` or garbage
    collection lets go."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._key = self.folder.resolve()
        if self._key in _held:
            _held[self._key][1] += 1
        else:
            _held[self._key] = [_take(self.folder), 1]
        self._release = weakref.finalize(self, _let_go, self._key)

    def release(self) -> None:
        self._release()


def _take(folder: Path) -> IO[str]:
    path = folder / LOCK
    try:
        # O_NONBLOCK: a FIFO planted as .lock would block the open; regular files ignore the flag
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as err:
        if path.is_symlink():
            raise UserInputError(planted(path, "a symbolic link")) from None
        raise UserInputError(f"{folder}: cannot open {LOCK} ({err.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(info.st_mode) else "a hard link to another file"
        raise UserInputError(planted(path, what))
    f = open(fd, "r+", encoding="utf-8")  # noqa: SIM115 - held open as the lock
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = ""
        for _ in range(50):  # the holder writes its pid just after taking the lock: give it that moment
            f.seek(0)
            holder = f.read().strip()
            if holder:
                break
            time.sleep(0.01)
        holder = holder or "another process"
        f.close()
        raise FolderBusy(
            f"{folder}: {holder} is writing this folder; wait for it to finish or pass another output folder"
        ) from None
    except OSError as err:
        f.close()
        raise UserInputError(
            f"{folder}: cannot lock {LOCK} ({err.strerror}); use a local output folder"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"vidforge pid {os.getpid()}\n")
    f.flush()
    return f


def _let_go(key: Path) -> None:
    entry = _held.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _held[key]
        entry[0].close()  # closing the file drops the flock

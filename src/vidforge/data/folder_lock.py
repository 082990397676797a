"""One writer per output folder: `FolderLock` holds an exclusive `flock` on `<folder>/.lock` while a stage
writes there. The kernel drops the lock when its holder dies (kill -9 included), so a dead run never
blocks the next one. A second process is refused at once with one line; within one process the lock is
re-entrant (a run retried in the same interpreter, tests), shared until its last holder lets go.

Why it matters: a run's start-up removes what a killed run left half-written (`*.tmp-*`); without the
lock it removed a concurrent run's files in progress, and that run failed its units. On a network
filesystem without flock support the lock cannot be taken; the error says so."""

from __future__ import annotations

import fcntl
import os
import time
import weakref
from pathlib import Path
from typing import IO

from vidforge.errors import UserInputError

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
    f = open(folder / LOCK, "a+", encoding="utf-8")  # noqa: SIM115 - held open as the lock
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

"""The run's CPU intra-op thread count, fixed by the run: recorded in every checkpoint, restored on
resume.

The count is part of what a CPU run computes: torch splits its reductions among that many threads, and
where a split changes the order of a float sum it changes the bits. A run resumed from a shell with
another OMP_NUM_THREADS (or another `torch.set_num_threads`) would continue with other sums; it takes
back the count it was started with, and says so."""

from __future__ import annotations

import torch


def recorded_threads() -> int:
    """What a checkpoint records: the count this process computes with."""
    return torch.get_num_threads()


def restore_threads(recorded: int | None, notes: list[str]) -> None:
    """Compute with `recorded`, a resumed checkpoint's count (None: one saved before counts were), when
    it differs from the process's, and note it."""
    now = torch.get_num_threads()
    if recorded is not None and recorded != now:
        torch.set_num_threads(recorded)
        notes.append(
            f"CPU threads: {now} in this process, {recorded} when the run started; continued with "
            f"{recorded} so the resumed steps compute as the uninterrupted run's"
        )

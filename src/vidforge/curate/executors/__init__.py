"""Executors run a chain of Stages over units: `local` (process/thread pools) and `ray` (a Ray cluster).
Both share one driver loop (`base.drive`): backpressure, fan-out, unit completion, errors."""

from __future__ import annotations

from vidforge.curate.executors.base import Backend, UnitCallback, WorkerLost, drive


def make_executor(name: str, **options):
    """`local` or `ray` by name (the CLI's `--executor`)."""
    if name == "local":
        from vidforge.curate.executors.local import LocalExecutor

        return LocalExecutor(**options)
    if name == "ray":
        from vidforge.curate.executors.ray import RayExecutor

        return RayExecutor(**options)
    from vidforge.errors import UserInputError

    raise UserInputError(f"--executor {name!r}: use local or ray")


__all__ = ["Backend", "UnitCallback", "WorkerLost", "drive", "make_executor"]

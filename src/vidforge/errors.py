"""Exception types the command line maps to exit codes. Library code raises these; it never exits."""

from __future__ import annotations


class UserInputError(ValueError):
    """Something the user gave is wrong (a path, a profile field, a layout). The message is one line that
    says what to change. The CLI prints it and exits with code 2."""


class Terminated(Exception):  # noqa: N818 - named for what happened, like KeyboardInterrupt
    """The run was asked to stop (SIGTERM: what SLURM and Kubernetes send before they kill or preempt) and
    stopped where it could continue from. The message says what was kept and how to go on. The CLI prints
    it and exits with code 143 (128 + SIGTERM, what schedulers read as terminated)."""

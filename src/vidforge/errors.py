"""Exception types the command line maps to exit codes. Library code raises these; it never exits."""

from __future__ import annotations


class UserInputError(ValueError):
    """Something the user gave is wrong (a path, a profile field, a layout). The message is one line that
    says what to change. The CLI prints it and exits with code 2."""

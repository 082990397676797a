"""Values from data made safe to print: a clip id, a caption or a path read from a run is shown as its
characters, never as instructions to the terminal or to rich."""

from __future__ import annotations

import unicodedata
from typing import Any

from rich.markup import escape

# Bidirectional overrides and isolates reorder what follows them on screen ("Trojan Source").
_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)}


def printable(value: Any) -> str:
    """`value` as text for a terminal cell or line: control characters (C0, DEL, C1: ESC starts every
    escape sequence, OSC titles end in BEL) and bidi controls written as `\\xNN` / `\\uNNNN`, and rich
    markup (`[link=...]`, `[red]`) escaped so it shows as typed."""
    text = str(value)
    if any(unicodedata.category(ch) == "Cc" or ch in _BIDI for ch in text):
        text = "".join(
            (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
            if unicodedata.category(ch) == "Cc" or ch in _BIDI
            else ch
            for ch in text
        )
    return escape(text)

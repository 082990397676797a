"""The train/validation split: a deterministic hash of the sample key, so a sample never changes split."""

from __future__ import annotations

import hashlib


def split_of(key: str, val_fraction: float, seed: str = "vidforge") -> str:
    """`val` for a `val_fraction` share of keys (uniform by hash), else `train`."""
    if val_fraction <= 0:
        return "train"
    digest = hashlib.sha256(f"{seed}\x1f{key}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    return "val" if u < val_fraction else "train"

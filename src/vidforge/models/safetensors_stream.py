"""Writing a safetensors file one tensor at a time, so a 14B model passes through holding one tensor.

`safetensors.torch.save_file` takes every tensor at once. The format is simple enough to stream: an
8-byte little-endian header length, a JSON header giving each tensor's dtype, shape and byte range
(padded with spaces to a multiple of 8), then the tensors' bytes back to back in that order. The header
needs only shapes and dtypes, which `safe_open(...).get_slice(name)` reads without loading the tensor."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from vidforge.files import atomic_file

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {dtype: name for name, dtype in DTYPES.items()}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor to write: its name, safetensors dtype name ("F32", "BF16", ...), shape, and a callable
    that loads it (called once, when its bytes are written)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    load: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype].itemsize


def write_safetensors(
    path: str | os.PathLike, entries: Sequence[TensorEntry], metadata: Mapping[str, str] | None = None
) -> Path:
    """Write `entries` to `path` (under a temporary name, renamed when complete). Each loaded tensor must
    have the entry's dtype and shape; it is written and dropped before the next one is loaded."""
    path = Path(path)
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for entry in entries:
        header[entry.name] = {
            "dtype": entry.dtype,
            "shape": list(entry.shape),
            "data_offsets": [offset, offset + entry.nbytes],
        }
        offset += entry.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with atomic_file(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for entry in entries:
            tensor = entry.load()
            if NAMES.get(tensor.dtype) != entry.dtype or tuple(tensor.shape) != entry.shape:
                raise ValueError(
                    f"{path}: {entry.name} loaded as {tensor.dtype} {tuple(tensor.shape)}, "
                    f"expected {entry.dtype} {entry.shape}"
                )
            f.write(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return path

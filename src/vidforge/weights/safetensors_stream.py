"""Writing a safetensors file one tensor at a time, so a 14B model passes through holding one tensor, and
reading a folder's tensors by name from the headers alone (`stored_tensors`).

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
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from vidforge.errors import UserInputError
from vidforge.families import read_json
from vidforge.files import atomic_file, output_folder, write_text

# diffusers' names for a model folder's weights: one file, or shards listed by an index
DIFFUSERS_SINGLE = "diffusion_pytorch_model.safetensors"
DIFFUSERS_INDEX = "diffusion_pytorch_model.safetensors.index.json"

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


# --- reading tensors by name ------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredTensor:
    file: Path
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return DTYPES[self.dtype].itemsize * math.prod(self.shape)


HEADER_LIMIT = 100 * 2**20  # safetensors' own bound on a header


def safetensors_shapes(path: Path, fix: str = "download it again") -> dict[str, StoredTensor]:
    """Every tensor's dtype and shape in the safetensors file `path`, from its header; a file that is not
    one, or is shorter than its header says, is a UserInputError naming it (and `fix`)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if length < 0 or length > HEADER_LIMIT:
            raise UserInputError(f"{path}: not a safetensors file (no header length); {fix}")
        if 8 + length > size:
            raise UserInputError(
                f"{path}: truncated: its header needs {8 + length} bytes, the file has {size}; {fix}"
            )
        try:
            header = json.loads(f.read(length))
            end = max(
                (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0
            )
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise UserInputError(
                f"{path}: not a safetensors file (its header is no JSON table); {fix}"
            ) from None
    if 8 + length + end > size:
        raise UserInputError(
            f"{path}: truncated: its tensors end at byte {8 + length + end}, the file has {size}; {fix}"
        )
    try:
        with safe_open(str(path), framework="pt") as f:
            return {
                key: StoredTensor(path, f.get_slice(key).get_dtype(), tuple(f.get_slice(key).get_shape()))
                for key in f.keys()
            }
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise UserInputError(f"{path}: not a readable safetensors file ({err}); {fix}") from None


def stored_tensors(folder: Path, single: str, index: str) -> dict[str, StoredTensor]:
    """Every tensor of the folder's safetensors (`single`, or the shards `index` names), by name, from
    the headers alone."""
    if (folder / index).is_file():
        weight_map = read_json(folder / index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserInputError(f"{folder / index}: no weight_map; download the index again")
        files = sorted(set(weight_map.values()))
    elif (folder / single).is_file():
        weight_map, files = None, [single]
    else:
        raise UserInputError(
            f"{folder}: neither {single} nor {index}; point at a folder of safetensors weights "
            "(convert .bin checkpoints with diffusers first)"
        )
    found: dict[str, StoredTensor] = {}
    for name in files:
        path = folder / name
        if not path.is_file():
            raise UserInputError(f"{path}: missing (named in {index}); download that shard again")
        found.update(safetensors_shapes(path))
    if weight_map is not None:
        for key, name in weight_map.items():
            if key not in found or found[key].file.name != name:
                raise UserInputError(f"{folder / name}: has no tensor {key} that {index} places there")
    return found


def lazy_entries(
    names: list[str], stored: dict[str, StoredTensor], files: ExitStack, cast: str | None
) -> list[TensorEntry]:
    """Entries that read each tensor from its open file (opened once, held by `files`) when written, cast
    to `cast` when asked: every family's export streams a folder's tensors through these."""
    handles: dict[Path, Any] = {}

    def loader(name: str):
        path = stored[name].file

        def load() -> torch.Tensor:
            if path not in handles:
                handles[path] = files.enter_context(safe_open(str(path), framework="pt"))
            tensor = handles[path].get_tensor(name)
            return tensor.to(DTYPES[cast]) if cast is not None else tensor

        return load

    return [TensorEntry(n, cast or stored[n].dtype, stored[n].shape, loader(n)) for n in names]


def _shard_groups(names: list[str], stored: Mapping[str, StoredTensor], max_bytes: int) -> list[list[str]]:
    """Consecutive groups of tensors of at most `max_bytes` each (a larger tensor alone)."""
    groups: list[list[str]] = [[]]
    size = 0
    for name in names:
        nbytes = stored[name].nbytes
        if groups[-1] and size + nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def write_diffusers_folder(
    out: str | os.PathLike,
    names: list[str],
    stored: Mapping[str, StoredTensor],
    config: dict[str, Any],
    max_shard_bytes: int,
) -> Path:
    """A diffusers model folder of `names` (read lazily from `stored`, under their own names): one
    safetensors file, or shards of at most `max_shard_bytes` with their index, and `config.json`."""
    out = output_folder(Path(out))
    groups = _shard_groups(names, stored, max_shard_bytes)
    weight_map: dict[str, str] = {}
    with ExitStack() as files:
        for i, group in enumerate(groups, start=1):
            name = (
                DIFFUSERS_SINGLE
                if len(groups) == 1
                else f"diffusion_pytorch_model-{i:05d}-of-{len(groups):05d}.safetensors"
            )
            write_safetensors(out / name, lazy_entries(group, stored, files, None), {"format": "pt"})
            weight_map.update(dict.fromkeys(group, name))
    if len(groups) > 1:
        total = sum(stored[n].nbytes for n in names)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        write_text(out / DIFFUSERS_INDEX, json.dumps(index, indent=2) + "\n")
    write_text(out / "config.json", json.dumps(config, indent=2) + "\n")
    return out

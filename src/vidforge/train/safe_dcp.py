"""Loading a torch.distributed.checkpoint directory without running code planted in it.

DCP unpickles `.metadata` with plain `pickle.load`, and loads every non-tensor value (optimizer
hyper-parameters, EMA counters) with `torch.load(weights_only=False)`: a crafted checkpoint runs whatever
its pickles name. Here `.metadata` goes through an unpickler that admits only DCP's own metadata types,
and non-tensor values through `torch.load(weights_only=True)`. Anything else refuses the checkpoint."""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from vidforge.data.paths import UnsafePath, plain_name
from vidforge.errors import UserInputError

# What a checkpoint's `.metadata` pickle may name: DCP's metadata dataclasses and the plain values they hold.
_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
        "StorageMeta",
        "MetadataIndex",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint.planner": {"LoadItemType", "WriteItemType"},
    "torch.serialization": {"_get_layout"},  # a layout from its name (torch.strided)
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "slice"},
}


class UnsafeCheckpoint(UserInputError):
    """A checkpoint file that names code or types a checkpoint never holds (tampered, or not DCP's)."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()) or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise UnsafeCheckpoint(
            f"{self.path}: names {module}.{name}, which checkpoint metadata never holds; refusing to load "
            "a tampered or foreign checkpoint (resume from another one, or start without --resume)"
        )


@contextmanager
def single_process_ok() -> Iterator[None]:
    """DCP warns on every save and load without a process group ("torch.distributed is disabled ...
    assuming the intent is to save in a single process"): that is what one process means here."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
        )
        yield


def load(state_dict: dict[str, Any], path: str | Path) -> None:
    """`dcp.load(state_dict)` from checkpoint folder `path`, its pickles restricted as above. Raises
    UnsafeCheckpoint (a user error) for a planted file; DCP's own wrapper of it is not an Exception."""
    path = Path(path)
    read_metadata(path / ".metadata")  # refused here, before DCP reads anything
    try:
        with single_process_ok():
            dcp.load(
                state_dict,
                checkpoint_id=str(path),
                storage_reader=SafeReader(path),
                planner=SafeLoadPlanner(),
            )
    except CheckpointException as err:
        # Not an Exception (a BaseException): left alone it passed the CLI's boundary as a traceback.
        failures = [exc for exc, _ in err.failures.values()]
        for exc in failures:
            if isinstance(exc, UnsafeCheckpoint):
                raise exc from None
        first = str(failures[0]).strip().splitlines() if failures else []
        why = f"{type(failures[0]).__name__}: {first[0] if first else ''}" if failures else str(err)
        raise UserInputError(
            f"{path}: cannot load this checkpoint ({why[:300]}); resume from the one before it (remove "
            "this folder) or start a new --run-dir"
        ) from None


def read_metadata(path: str | Path) -> Metadata:
    """A checkpoint's `.metadata` through the restricted unpickler."""
    path = Path(path)
    with open(path, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f, path).load()
        except UnsafeCheckpoint:
            raise
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as err:
            raise UnsafeCheckpoint(f"{path}: not checkpoint metadata ({err})") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f"{path}: not checkpoint metadata (a {type(metadata).__name__})")
    for info in (metadata.storage_data or {}).values():
        # The files DCP reads are named here: each must be one file of the checkpoint's own folder.
        name = getattr(info, "relative_path", None)
        try:
            plain_name(name if isinstance(name, str) else "", "checkpoint file")
        except UnsafePath as err:
            raise UnsafeCheckpoint(
                f"{path}: {err}; refusing to read outside the checkpoint folder (a tampered checkpoint)"
            ) from None
    return metadata


class SafeReader(FileSystemReader):
    """FileSystemReader whose `.metadata` is read by `read_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(self._get_metadata_path(kwargs.get("rank")))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner that loads non-tensor values with `weights_only=True` (what its own
    `load_bytes` does after `torch.load`, kept as it is)."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UnsafeCheckpoint(
                f"checkpoint value {fqn!r} is not plain data ({first}); refusing to load a tampered checkpoint"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj

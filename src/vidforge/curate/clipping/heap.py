"""glibc's allocator set to keep the memory an encoder frees for the next one, then give it back per source.

Each shot is its own x264 encoder (shot_recorder.py, transcode.py): opened, fed, closed. By default glibc
returns what a closed encoder frees to the kernel (large blocks are mmapped and unmapped, and a heap's free
top is trimmed past twice the last such block), so the next shot's encoder faults the same buffers in
again, each page zeroed by the kernel: on a 720p source cut into 5 shots about 20K page faults and 0.3 s
of system CPU, a twentieth of the decode and encode. Blocks under MMAP_THRESHOLD now come from the heap
and up to TRIM_THRESHOLD of freed memory stays there; `release` hands it back once a source is done.
Elsewhere than glibc (no `mallopt`) nothing changes."""

from __future__ import annotations

import ctypes
from functools import cache

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for it on 64-bit: a 4K frame (12 MB) is under it
TRIM_THRESHOLD = 256 << 20  # a 4K x264 encoder's buffers: more than a 720p one's ~60 MB


@cache
def _libc():
    """The C library when it is glibc (has mallopt and malloc_trim), else None."""
    libc = ctypes.CDLL(None)  # the symbols the process has loaded, the C library's among them
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


@cache
def keep_freed_memory() -> bool:
    """Set the thresholds (once a process); whether the allocator took them."""
    libc = _libc()
    if libc is None:
        return False
    return bool(
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def release() -> None:
    """Return the heaps' free memory to the kernel (after a source: the next may be long in coming)."""
    libc = _libc()
    if libc is not None and keep_freed_memory():
        libc.malloc_trim(0)

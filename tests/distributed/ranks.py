"""Run a function on N local CPU processes joined by a gloo process group, and collect what each returns.

    from ranks import run_ranks
    results = run_ranks(_worker, 2, arg1, arg2)   # [rank 0's return value, rank 1's, ...]

`_worker(rank, world_size, *args)` must be a module-level function (it is pickled into spawned
processes). It runs after `dist.init_process_group("gloo")` and before `destroy_process_group`;
its return value must be picklable (tensors are fine: return `.detach().clone()`). A failure on any
rank fails the call with that rank's traceback. Every process uses one torch thread: on a 2-core
machine, N processes x several OpenMP threads each is many times slower than one thread each.

The ranks are forked from a server process that imported torch and vidforge's training code once per test
process (multiprocessing's forkserver, `PRELOAD`), rather than started bare (spawn): a bare rank spent
5-8 CPU seconds importing before its first op (torch, the training loop, the planner's torch._dynamo), more
than many of these tests' work, and `make test` starts hundreds of ranks. A rank still gets the caller's
environment as it is at the call, as a spawned one did.
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable
from queue import Empty
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# What the fork server imports once (a module that is missing is skipped): what most ranks import anyway.
PRELOAD = ["torch", "torch.distributed", "vidforge.train.loop", "vidforge.bench.plan"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    rank: int, world_size: int, port: int, env: dict, fn: Callable, args: tuple, queue, collected
) -> None:
    os.environ.clear()  # the caller's environment now, not the fork server's from its start
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        try:
            queue.put((rank, True, fn(rank, world_size, *args)))
            # A tensor result travels as a shared-memory handle that the parent can open only while this
            # process lives: stay until the parent has read every result.
            collected.wait(60)
        finally:
            dist.destroy_process_group()
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
        raise


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 300.0) -> list[Any]:
    """fn(rank, world_size, *args) on `world_size` gloo ranks; returns the results in rank order."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    queue, collected = ctx.Queue(), ctx.Event()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_entry,
            args=(rank, world_size, port, dict(os.environ), fn, args, queue, collected),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        # Read before joining: a rank blocks in put() until its (possibly large) result is read.
        for _ in range(world_size):
            try:
                rank, ok, value = queue.get(timeout=timeout)
            except Empty:
                codes = [p.exitcode for p in procs]
                raise AssertionError(
                    f"ranks {sorted(set(range(world_size)) - set(results))} returned nothing within "
                    f"{timeout} s (exit codes {codes})"
                ) from None
            if not ok:  # the other ranks may wait forever in a collective: stop them all
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        collected.set()
        for p in procs:
            p.join(5 if len(results) == world_size else 0)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world_size)]

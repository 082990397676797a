"""Two gloo processes as one model-parallel group: both get identical samples, equal to a single-process
loader's, while each shard is read once per group (allgather: each rank fetches half; broadcast: rank 0)."""

from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

from vidforge.data.loader import ShardLoader
from vidforge.data.testing import make_latent_shards

N = 23


def _worker(rank: int, init: str, root: str, mode: str, out: str) -> None:
    import torch.distributed as dist

    from vidforge.data.loader import GroupComm

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        loader = ShardLoader([root], seed=4, shuffle_buffer=5, group=GroupComm(None, mode))
        fetched = []
        fetch = loader.fetch
        loader.fetch = lambda ref: fetched.append(ref) or fetch(ref)
        keys = [s["__key__"] for _, s in zip(range(N), loader, strict=False)]
        with open(f"{out}.{rank}", "w") as f:
            json.dump({"keys": keys, "fetched": len(fetched)}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.parametrize("mode", ["allgather", "broadcast"])
def test_model_parallel_group_sees_identical_samples(tmp_path, mode):
    root = make_latent_shards(tmp_path / "s", shards=3, per_shard=5)
    reference = [
        s["__key__"] for _, s in zip(range(N), ShardLoader([root], seed=4, shuffle_buffer=5), strict=False)
    ]
    out = tmp_path / "res"
    mp.start_processes(
        _worker,
        args=(f"file://{tmp_path / 'store'}", str(root), mode, str(out)),
        nprocs=2,
        start_method="spawn",
        join=True,
    )
    results = [json.loads((tmp_path / f"res.{r}").read_text()) for r in range(2)]
    assert results[0]["keys"] == results[1]["keys"] == reference
    fetched = [r["fetched"] for r in results]
    if mode == "allgather":
        assert abs(fetched[0] - fetched[1]) <= 1 and sum(fetched) <= N + 2  # each sample read once per group
    else:
        assert fetched[1] == 0 and fetched[0] >= N

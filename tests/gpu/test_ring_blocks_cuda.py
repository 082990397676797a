"""Every kernel ring attention runs its blocks with on CUDA (SDPA's cuDNN, flash and memory-efficient ops,
flash-attn where installed), on the device in bf16, against the einsum reference in float64 on the CPU:
a ring's arithmetic in one process (`attend_blocks`: blocks merged by log-sum-exp, the backward of each
block from the merged output), for packed pieces with pads and a sample without keys in one block, and
for a plain batch whose block ends in pads, and for joint attention's blocks (`PrefixKeys`: a caption
block and video blocks of other lengths than the queries, every query seeing a prefix of each)."""

from __future__ import annotations

import pytest
import torch
from gpu_device import rel_error

from vidforge.attention.dispatch import flash_attn_available
from vidforge.parallel.attention_blocks import BlockKeys, Einsum, PrefixKeys, attend_blocks, block_kernel

pytestmark = pytest.mark.gpu

KERNELS = [("sdpa", "cudnn"), ("sdpa", "flash"), ("sdpa", "efficient"), ("sdpa", "auto"), ("flash", "auto")]
HEADS, DIM = 4, 64
ROWS = {  # per block: which keys each piece of queries sees (BlockKeys), and the batch
    "packed": ((BlockKeys((40, 17, 88), (39, 0, 88)), BlockKeys((40, 17, 88), (40, 17, 87))), 1),
    "plain": ((BlockKeys((128,), (128,)), BlockKeys((128,), (120,))), 2),
}
# Joint attention's blocks, each a prefix seen by 160 queries (96 video tokens and the caption): the caption
# (77 keys of 100), a rank's video block, the last rank's with pads.
ROWS["joint"] = ((PrefixKeys(77), PrefixKeys(96), PrefixKeys(90)), 2)
KEY_LENGTHS = {"joint": (100, 96, 96)}
QUERIES = {"joint": 160}


@pytest.mark.parametrize("row", list(ROWS))
@pytest.mark.parametrize(("backend", "kernel"), KERNELS, ids=[f"{b}-{k}" for b, k in KERNELS])
def test_ring_block_kernel_matches_the_float64_einsum(device, backend, kernel, row):
    if backend == "flash" and not flash_attn_available():
        pytest.skip("flash-attn is not installed on this machine")
    blocks, batch = ROWS[row]
    g = torch.Generator().manual_seed(0)
    queries = QUERIES.get(row) or blocks[0].length
    q, grad = (torch.randn((batch, queries, HEADS, DIM), generator=g, dtype=torch.float64) for _ in range(2))
    lengths = KEY_LENGTHS.get(row) or [queries] * len(blocks)
    kv = [
        [torch.randn((batch, n, HEADS, DIM), generator=g, dtype=torch.float64) for _ in range(2)]
        for n in lengths
    ]
    ref = attend_blocks(
        Einsum(2048), q, [(k, v, keys) for (k, v), keys in zip(kv, blocks, strict=True)], grad
    )

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q_on, grad_on = (t.to(device, dtype) for t in (q, grad))
    on = [(k.to(device, dtype), v.to(device, dtype), keys) for (k, v), keys in zip(kv, blocks, strict=True)]
    chosen = block_kernel(backend, kernel, q_on)
    out, dq, dks, dvs = attend_blocks(chosen, q_on, on, grad_on)
    assert rel_error(out, ref[0]) < 2e-2, chosen.name
    assert rel_error(dq, ref[1]) < 3e-2, chosen.name
    for got, want in zip([*dks, *dvs], [*ref[2], *ref[3]], strict=True):
        assert rel_error(got, want) < 3e-2, chosen.name

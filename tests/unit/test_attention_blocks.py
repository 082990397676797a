"""Ring attention's per-block kernels (vidforge.parallel.attention_blocks) in one process: the CPU flash
kernel's log-sum-exp convention against a direct computation, and a ring simulated over key blocks
(forward merged by log-sum-exp, backward per block from the merged output) against autograd through
one softmax over all keys, for the fused kernel and the einsum reference. float64: the computations
differ in summation order only."""

import math

import pytest
import torch

from vidforge.parallel.attention_blocks import (
    BlockKeys,
    CpuFlash,
    Einsum,
    PrefixKeys,
    attend_blocks,
    block_kernel,
)

TOL = {"rtol": 1e-10, "atol": 1e-10}


def test_cpu_flash_kernel_returns_natural_log_sum_exp_per_query():
    """aten._scaled_dot_product_flash_attention_for_cpu gives (out, lse) with lse (B, H, Lq) the natural
    log of each query's softmax denominator over the scaled scores, in the inputs' dtype for float64
    (float32 for bf16); the ring's merge relies on exactly that."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 5, 3, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 7, 3, 8, generator=g, dtype=torch.float64) for _ in range(2))
    scale = 1 / math.sqrt(8)
    out, lse = CpuFlash().forward(q, k, v, scale)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    direct = torch.log(torch.exp(scores).sum(-1))
    assert lse.shape == (2, 3, 5) and lse.dtype == torch.float64
    torch.testing.assert_close(lse, direct, **TOL)
    torch.testing.assert_close(out, torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, -1), v), **TOL)
    _, lse_bf16 = CpuFlash().forward(q.bfloat16(), k.bfloat16(), v.bfloat16(), scale)
    assert lse_bf16.dtype == torch.float32
    torch.testing.assert_close(lse_bf16.double(), direct, rtol=0, atol=0.1)


# Three samples' pieces (4, 2 and 3 queries); in block 0 the second sample has one real key and the
# third none (a sample shorter than the ring: its queries see nothing there), in block 1 every key of
# the first and third samples is real; pads follow the real keys of each piece.
BLOCKS = (BlockKeys((4, 2, 3), (3, 1, 0)), BlockKeys((4, 2, 3), (4, 2, 3)))
EQUAL = (BlockKeys((3, 3), (2, 2)), BlockKeys((3, 3), (3, 3)))  # equal pieces: one batched run per block
PLAIN = (BlockKeys((6,), (6,)), BlockKeys((6,), (4,)))  # a plain row; the second block ends in pads


def _ring_simulated(kernel, blocks, batch):
    """Queries against len(blocks) key blocks of the queries' layout, as the ring computes them; returns
    the merged output and the gradients of q and of every block's k and v for a random weighting of
    the output, with the same from autograd through one masked softmax over all blocks' keys."""
    g = torch.Generator().manual_seed(1)
    length, heads = blocks[0].length, 2
    q = torch.randn(batch, length, heads, 8, generator=g, dtype=torch.float64)
    ks = [torch.randn(batch, length, heads, 8, generator=g, dtype=torch.float64) for _ in blocks]
    vs = [torch.randn(batch, length, heads, 8, generator=g, dtype=torch.float64) for _ in blocks]
    weight = torch.randn(batch, length, heads, 8, generator=g, dtype=torch.float64)
    scale = 1 / math.sqrt(8)

    out, dq, dks, dvs = attend_blocks(kernel, q, list(zip(ks, vs, blocks, strict=True)), weight)
    dkv = [t for pair in zip(dks, dvs, strict=True) for t in pair]

    leaves = [t.clone().requires_grad_() for t in (q, *ks, *vs)]
    qr, kr, vr = leaves[0], leaves[1 : 1 + len(blocks)], leaves[1 + len(blocks) :]
    allowed = torch.cat([keys.allowed(q.device) for keys in blocks], dim=1)
    scores = torch.einsum("bqhd,bkhd->bhqk", qr, torch.cat(kr, 1)) * scale
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
    reference = torch.einsum("bhqk,bkhd->bqhd", probs, torch.cat(vr, 1))
    (reference * weight).sum().backward()
    ref_dkv = [t.grad for pair in zip(kr, vr, strict=True) for t in pair]
    return (out, dq, *dkv), (reference.detach(), qr.grad, *ref_dkv)


@pytest.mark.parametrize("kernel", [CpuFlash(), Einsum(query_chunk=3)], ids=["cpu-flash", "einsum"])
@pytest.mark.parametrize(
    "blocks, batch", [(BLOCKS, 1), (EQUAL, 1), (PLAIN, 2)], ids=["packed", "equal", "plain"]
)
def test_blocks_merged_and_differentiated_equal_one_softmax(kernel, blocks, batch):
    """Output and q/k/v gradients of the simulated ring equal one softmax over all keys: packed pieces
    with pads and with a sample that has no key in a block, and a plain batch whose block ends in pads
    (their key gradients are 0, as autograd's)."""
    mine, reference = _ring_simulated(kernel, blocks, batch)
    for got, want in zip(mine, reference, strict=True):
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("kernel", [CpuFlash(), Einsum(query_chunk=4)], ids=["cpu-flash", "einsum"])
def test_prefix_blocks_of_other_lengths_equal_one_softmax(kernel):
    """Joint attention's blocks (`PrefixKeys`): 6 queries against blocks of 5, 4 and 7 keys of which every
    query sees the first 3, none and all; merged and differentiated as the ring does, equal to one softmax
    over the seen keys (the unseen ones' gradients 0)."""
    g = torch.Generator().manual_seed(2)
    lengths, counts = (5, 4, 7), (3, 0, 7)
    q, weight = (torch.randn(2, 6, 2, 8, generator=g, dtype=torch.float64) for _ in range(2))
    ks = [torch.randn(2, n, 2, 8, generator=g, dtype=torch.float64) for n in lengths]
    vs = [torch.randn(2, n, 2, 8, generator=g, dtype=torch.float64) for n in lengths]
    blocks = [(k, v, PrefixKeys(c)) for k, v, c in zip(ks, vs, counts, strict=True)]
    out, dq, dks, dvs = attend_blocks(kernel, q, blocks, weight)

    leaves = [t.clone().requires_grad_() for t in (q, *ks, *vs)]
    qr, kr, vr = leaves[0], leaves[1:4], leaves[4:]
    seen = torch.cat([torch.arange(n) < c for n, c in zip(lengths, counts, strict=True)])
    scores = torch.einsum("bqhd,bkhd->bhqk", qr, torch.cat(kr, 1)) / math.sqrt(8)
    probs = torch.softmax(scores.masked_fill(~seen, float("-inf")), -1)
    reference = torch.einsum("bhqk,bkhd->bqhd", probs, torch.cat(vr, 1))
    (reference * weight).sum().backward()
    torch.testing.assert_close(out, reference.detach(), **TOL)
    torch.testing.assert_close(dq, qr.grad, **TOL)
    for got, want in zip([*dks, *dvs], [t.grad for t in (*kr, *vr)], strict=True):
        torch.testing.assert_close(got, want, **TOL)


def test_runs_group_equal_segments_and_leave_out_keyless_ones():
    """Neighbouring segments of equal (queries, keys) run as one batch; one without keys breaks a run."""
    keys = BlockKeys((2, 2, 2, 3, 2, 2), (1, 1, 1, 3, 0, 1))
    assert [(r.start, r.count, r.q_len, r.kv_len) for r in keys.runs()] == [
        (0, 3, 2, 1),
        (6, 1, 3, 3),
        (11, 1, 2, 1),
    ]


def test_kernel_choice_on_the_cpu():
    """dense (and sdpa_backend=math) picks the einsum reference, sdpa and flex the CPU flash kernel;
    flash-attn on the CPU is refused with what to use instead."""
    q = torch.zeros(1, 4, 2, 8)
    assert isinstance(block_kernel("dense", "auto", q), Einsum)
    assert isinstance(block_kernel("sdpa", "math", q), Einsum)
    assert isinstance(block_kernel("sdpa", "auto", q), CpuFlash)
    assert isinstance(block_kernel("flex", "auto", q), CpuFlash)
    with pytest.raises(ValueError, match="model.attention=sdpa"):
        block_kernel("flash", "auto", q)

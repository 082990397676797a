"""Context parallel, single-process parts: the TokenShard split (balanced, lossless, index maps that
agree with each other and with the layout), the per-block attention and log-sum-exp merge of ring
attention against a direct softmax, and the model's refusal to run sharded attention without cp."""

import math

import pytest
import torch

from vidforge.attention.dispatch import attention
from vidforge.models import SequenceLayout, build_model, model_config
from vidforge.parallel.cp_attention import block_attention, merge_partial
from vidforge.tokens import ContextShard, TokenShard

LAYOUTS = [
    SequenceLayout(((2, 2, 3), (1, 1, 1), (3, 2, 2), (1, 2, 5))),  # 12 + 1 + 12 + 10 tokens
    SequenceLayout(((4, 3, 3),)),
    SequenceLayout(((1, 1, 2), (1, 1, 3))),  # samples shorter than the cp degree
]


def _shards(layout, size):
    return [TokenShard.of_layout(layout, r, size) for r in range(size)]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("layout", LAYOUTS, ids=["mixed", "one", "short"])
def test_split_is_balanced(layout, size):
    """Every rank holds the same number of tokens, the real ones differ by at most the padding, the
    padding is under size per sample, and every rank holds its share of every sample."""
    shards = _shards(layout, size)
    assert len({s.local for s in shards}) == 1
    real = [int(s.valid().sum()) for s in shards]
    assert sum(real) == layout.total
    assert max(real) - min(real) <= shards[0].pad
    assert shards[0].pad == sum((-n) % size for n in layout.seqlens) < size * layout.num_samples
    for i, n in enumerate(layout.seqlens):  # each sample's real tokens: within one of n_i / size per rank
        counts = [int((s.valid() & (s.token_sample() == i)).sum()) for s in shards]
        assert sum(counts) == n and max(counts) - min(counts) <= 1


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS, ids=["mixed", "one", "short"])
def test_split_then_assemble_is_the_identity(layout, size):
    """Splitting a row over the ranks and assembling the concatenated shares gives the row back; each
    real token lands on exactly one rank; pads are zeros."""
    row = torch.randn(2, layout.total, 3)
    shards = _shards(layout, size)
    parts = [s.split(row) for s in shards]
    for s, part in zip(shards, parts, strict=True):
        assert part.shape == (2, s.local, 3)
        assert torch.all(part[:, ~s.valid()] == 0)
    torch.testing.assert_close(shards[0].assemble(torch.cat(parts, dim=1)), row, rtol=0, atol=0)
    held = torch.cat([s.row_index() for s in shards])
    assert sorted(held[held >= 0].tolist()) == list(range(layout.total))


@pytest.mark.parametrize("size", [2, 3])
def test_index_maps_agree_with_the_layout(size):
    """Local positions and sample indices are the layout's at the tokens held; the gathered padded
    order is a permutation that lists each sample's tokens contiguously and in row order."""
    layout = LAYOUTS[0]
    shards = _shards(layout, size)
    full_positions, full_sample = layout.positions(), layout.sample_index()
    for s in shards:
        index = s.row_index()
        real = index >= 0
        assert torch.equal(s.positions()[real], full_positions[index[real]])
        assert torch.equal(s.positions()[~real], torch.zeros_like(s.positions()[~real]))
        assert torch.equal(s.token_sample()[real], full_sample[index[real]])
    order = shards[0].gathered_padded_order()
    assert sorted(order.tolist()) == list(range(size * shards[0].local))
    gathered_rows = torch.cat([s.row_index() for s in shards])  # row index of every gathered token
    padded = gathered_rows[order]
    start = 0
    for n, p, offset in zip(layout.seqlens, shards[0].padded_lens, layout.offsets, strict=False):
        sample = padded[start : start + p]
        assert sample[sample >= 0].tolist() == list(range(offset, offset + n))
        start += p


def test_plain_grid_shard_is_a_contiguous_slice():
    """A plain batch's rows are split into contiguous chunks (whole frames when T divides): the frames
    layout of the ST-DiT hybrid."""
    s = TokenShard.of_grid((4, 2, 3), 1, 2)
    assert s.local == 12 and s.pad == 0
    assert s.row_index().tolist() == list(range(12, 24))
    with pytest.raises(ValueError, match="outside"):
        TokenShard.of_grid((4, 2, 3), 2, 2)


def _softmax_attention(q, k, v, allowed):
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


def test_merged_blocks_equal_softmax_over_all_keys():
    """Ring attention's arithmetic: attention to key blocks merged by log-sum-exp equals one softmax
    over all keys, including blocks in which some queries see no key at all (-inf partials). float64:
    the two differ only by rounding (1e-12)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 5, 3, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 12, 3, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 12, 3, 6, generator=g, dtype=torch.float64)
    allowed = torch.rand(5, 12, generator=g) < 0.5
    allowed[:, 0] = True  # every query sees some key overall
    allowed[2, 4:] = False  # query 2 sees nothing in the later blocks
    out = q.new_zeros(2, 5, 3, 6)
    lse = q.new_full((2, 3, 5), float("-inf"))
    for start in (0, 4, 8):
        block = slice(start, start + 4)
        part = block_attention(q, k[:, block], v[:, block], allowed[:, block], 1 / math.sqrt(8))
        out, lse = merge_partial(out, lse, *part)
    torch.testing.assert_close(out, _softmax_attention(q, k, v, allowed), rtol=1e-12, atol=1e-12)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(8)
    torch.testing.assert_close(lse, torch.logsumexp(scores.masked_fill(~allowed, float("-inf")), -1))


def test_sharded_attention_without_cp_is_refused():
    """A model called with a TokenShard but no context-parallel attention installed says what to do."""
    shard = TokenShard.of_grid((2, 2, 2), 0, 2)
    q = torch.randn(1, shard.local, 2, 8)
    with pytest.raises(ValueError, match="apply_cp"):
        attention(q, q, q, ContextShard("full", shard))
    model = build_model(model_config("tiny", patch=[1, 1, 1]))
    x = torch.randn(1, shard.local, model.config.patch_dim)
    with pytest.raises(ValueError, match="apply_cp"):
        model(x, torch.zeros(1), torch.zeros(1, 3, 32), shard=shard)
    with pytest.raises(ValueError, match="this rank's tokens"):
        model(torch.randn(1, 8, model.config.patch_dim), torch.zeros(1), torch.zeros(1, 3, 32), shard=shard)

"""The positions slicing of `TokenShard` (parallel.cp_impl=st-spatial), single process: every rank holds
whole (h, w) position columns of every frame, at their true (t, h, w), the pads only where H x W does not
divide by the cp degree, and split / assemble / the gathered index maps lose nothing. The reference is
a direct enumeration of the row's positions."""

import pytest
import torch

from vidforge.tokens import SequenceLayout, TokenShard

# images (T = 1) and odd frame counts beside each other; 3x3 = 9 and 1x5 = 5 positions do not divide by 2
LAYOUT = SequenceLayout(((1, 2, 3), (5, 3, 3), (9, 2, 2), (3, 1, 5)))


def _shards(size: int) -> list[TokenShard]:
    return [TokenShard.of_layout(LAYOUT, r, size, slicing="positions") for r in range(size)]


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_each_rank_holds_whole_position_columns(size: int) -> None:
    """Rank r's real tokens of a sample are every frame at the positions it owns (contiguous flattened
    (h, w) ranges, the first H W % size ranks one more), t-major as a (T, q) grid, pads at the end of each
    frame's columns; positions are the row's own (t, h, w)."""
    full = LAYOUT.positions()
    owner: dict[tuple[int, int], int] = {}
    for s in _shards(size):
        index, positions = s.row_index(), s.positions()
        real = index >= 0
        assert torch.equal(positions[real], full[index[real]])
        start = 0
        for i, ((t, h, w), q) in enumerate(zip(LAYOUT.grids, s.columns, strict=True)):
            assert q == -(-(h * w) // size)
            piece = index[start : start + t * q].view(t, q)
            start += t * q
            held = piece[0][piece[0] >= 0] - LAYOUT.offsets[i]  # the flattened positions of frame 0
            assert held.tolist() == list(range(int(held[0]), int(held[0]) + len(held)))
            assert len(held) in (h * w // size, h * w // size + 1)
            for f in range(t):  # every frame: the same columns, then the same pads
                expect = torch.where(piece[0] >= 0, piece[0] + f * h * w, -1)
                assert torch.equal(piece[f], expect)
            for n in held.tolist():
                assert owner.setdefault((i, n), s.rank) == s.rank
    assert len(owner) == sum(h * w for _, h, w in LAYOUT.grids)  # every position owned by one rank


@pytest.mark.parametrize("size", [2, 3, 4])
def test_split_then_assemble_is_the_identity(size: int) -> None:
    row = torch.randn(1, LAYOUT.total, 3)
    shards = _shards(size)
    parts = [s.split(row) for s in shards]
    assert len({s.local for s in shards}) == 1
    pads = sum(t * (size * q - h * w) for (t, h, w), q in zip(LAYOUT.grids, shards[0].columns, strict=True))
    assert shards[0].pad == pads
    for s, part in zip(shards, parts, strict=True):
        assert torch.all(part[:, ~s.valid()] == 0)
        assert sum(s.local_counts()) == int(s.valid().sum())
    gathered = torch.cat(parts, dim=1)
    torch.testing.assert_close(shards[0].assemble(gathered), row, rtol=0, atol=0)
    rows = torch.cat([s.row_index() for s in shards])
    assert torch.equal(rows[shards[0].gathered_row_index()], torch.arange(LAYOUT.total))


def test_one_frame_without_pads_gathers_in_row_order() -> None:
    """An image whose positions divide: the ranks' columns concatenated are the row itself."""
    s = TokenShard.of_grid((1, 2, 4), 1, 2, slicing="positions")
    assert s.gathered_is_row_order and s.row_index().tolist() == [4, 5, 6, 7]
    video = TokenShard.of_grid((3, 2, 4), 1, 2, slicing="positions")
    assert not video.gathered_is_row_order
    assert video.row_index().tolist() == [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23]
    assert video.local_grids == ((3, 1, 4),)

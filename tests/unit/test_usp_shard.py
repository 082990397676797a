"""2D context parallel's host-side pieces (parallel.cp_impl=usp), without processes: the tokens a ring rank
holds after the Ulysses all-to-all (`GroupShard`, reached with `group_order`), and the ranks of the
Ulysses and ring groups (`cp_2d_ranks`). Checked against `TokenShard`'s own split of the row (the 1D
split the rest of the model uses) and against the cluster's nodes, counted directly."""

from __future__ import annotations

import itertools

import pytest
import torch

from vidforge.parallel.dims import cp_2d_ranks
from vidforge.parallel.usp_attention import GroupShard, group_order
from vidforge.profile.parallel import Layout
from vidforge.tokens import SequenceLayout, TokenShard


def _layout(lengths: list[int]) -> SequenceLayout:
    return SequenceLayout(tuple((n, 1, 1) for n in lengths))


@pytest.mark.parametrize(("cp", "inner"), [(4, 2), (6, 2), (6, 3), (8, 4)])
@pytest.mark.parametrize("lengths", [[12, 3, 9], [1, 7, 26, 5], [24]])
def test_group_order_gives_the_group_shard_of_the_ulysses_groups_tokens(cp, inner, lengths):
    """The Ulysses group's tokens concatenated by rank (what the all-to-all gives), reordered with
    `group_order`, are the `GroupShard`'s split of the row: the same tokens, every real one where its
    row index says, the pads where `valid` says, and each sample's real tokens a contiguous range."""
    layout = _layout(lengths)
    row = torch.arange(1, layout.total + 1, dtype=torch.float64)[None, :, None]  # 0 is a pad's value
    covered = []
    for rank in range(cp):
        shard = TokenShard.of_layout(layout, rank, cp)
        first = rank // inner * inner
        gathered = torch.cat(
            [TokenShard.of_layout(layout, first + j, cp).split(row) for j in range(inner)], 1
        )
        group = GroupShard.of(shard, inner)
        mine = gathered.index_select(1, group_order(shard, inner, torch.device("cpu")))
        assert torch.equal(mine, group.split(row))
        assert torch.equal(group.valid(), mine[0, :, 0] > 0)
        assert group.token_sample().tolist() == sorted(group.token_sample().tolist())
        if rank % inner == 0:
            covered.append(group.row_index()[group.valid()])
    # The ring ranks' real tokens are the row, each once, and assemble gives it back in order.
    assert torch.equal(torch.sort(torch.cat(covered)).values, torch.arange(layout.total))
    groups = [GroupShard.of(TokenShard.of_layout(layout, r * inner, cp), inner) for r in range(cp // inner)]
    gathered = torch.cat([g.split(row) for g in groups], 1)
    assert torch.equal(groups[0].assemble(gathered), row)


def test_group_shard_of_a_plain_batch_without_pads_is_the_ring_split():
    """12 tokens a row over cp 4 = 2 x 2: the ring rank holds a contiguous half of every row, as
    `TokenShard` over 2 ranks does."""
    shard = TokenShard.of_grid((3, 2, 2), 3, 4)
    group = GroupShard.of(shard, 2)
    assert torch.equal(group.row_index(), TokenShard.of_grid((3, 2, 2), 1, 2).row_index())
    assert group.gathered_is_row_order


@pytest.mark.parametrize(
    ("degrees", "ulysses", "gpus_per_node"),
    [((1, 1, 2, 4, 2), 2, 4), ((2, 1, 1, 8, 1), 4, 4), ((1, 2, 1, 4, 2), 4, 8)],
)
def test_ulysses_groups_lie_in_a_node_and_ring_groups_take_one_rank_from_each(
    degrees, ulysses, gpus_per_node
):
    """With tp x cp_ulysses dividing gpus_per_node every Ulysses group is inside one node; the ring
    groups pair the Ulysses groups' i-th ranks; both together partition every cp group, in cp order."""
    layout = Layout(*degrees)
    ranks = torch.arange(layout.world_size).reshape(degrees)
    inner, ring = cp_2d_ranks(ranks, ulysses)
    assert all(len({r // gpus_per_node for r in group}) == 1 for group in inner)
    cp_groups = ranks.movedim(3, -1).reshape(-1, layout.cp).tolist()
    for cp_group in cp_groups:
        mine = [g for g in inner if g[0] in cp_group]
        assert list(itertools.chain(*mine)) == cp_group  # consecutive cp ranks, in order
        rings = [g for g in ring if g[0] in cp_group]
        assert [[g[i] for g in mine] for i in range(ulysses)] == rings

"""2D context parallel (`parallel.cp_impl=usp`, as USP / xDiT do): cp = cp_ulysses x cp_ring.

The cp group's ranks form cp_ring groups of cp_ulysses consecutive ranks (`ParallelDims.cp_2d_groups`):
consecutive ranks share a node, so Ulysses's all-to-alls use the fast links, and only the ring, whose
transfers overlap its blocks' compute, crosses nodes. For this rank's tokens (B, local, H, D) of a row
split over cp ranks (`TokenShard`):

1. all-to-all in the Ulysses group (`heads_to_tokens`): the group's tokens, H / cp_ulysses heads;
2. those tokens reordered so each sample's real tokens come first, in row order, then its pads: exactly
   the pieces a `GroupShard` describes (the group's cp ranks' pieces of every sample, concatenated);
3. ring attention over the ring group on that shard, cp_ring ranks, each cp_ulysses times longer;
4. back to the all-to-all's order and all-to-all back (`tokens_to_heads`).

Per rank, the ring passes cp_ring - 1 blocks instead of cp - 1 (each cp_ulysses times the tokens with
1 / cp_ulysses of the heads: the same bytes), and the all-to-alls move (u - 1) / u of q, k, v and the
output inside the node. Pads stay what they are under every implementation: never keys, finite outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from vidforge.errors import UserInputError
from vidforge.parallel.cp_attention import heads_to_tokens, ring_attention, tokens_to_heads, ulysses_attention
from vidforge.tokens import TokenShard


@dataclass(frozen=True, eq=False)
class GroupShard(TokenShard):
    """The tokens a ring rank holds after the Ulysses all-to-all: the pieces of `inner` consecutive cp
    ranks (`rank` x inner ... of a `TokenShard` over `size` x inner ranks), per sample their real tokens
    first (a contiguous range of the row: consecutive ranks hold consecutive pieces), then their pads.
    Every rank holds inner x c_i tokens of sample i: what ring attention needs (the same token-to-sample
    map on every rank, pads at the ends of the samples' chunks), with the row order and the pads of the
    cp split, so `valid`, `assemble` and the rest keep their meaning."""

    inner: int = 1

    @classmethod
    def of(cls, shard: TokenShard, inner: int) -> GroupShard:
        """The ring rank's shard made of `shard`'s Ulysses group (its `inner` consecutive cp ranks)."""
        return cls(shard.layout, shard.rank // inner, shard.size // inner, shard.packed, inner=inner)

    @property
    def chunk_lens(self) -> tuple[int, ...]:
        cp = self.size * self.inner
        return tuple(self.inner * -(-n // cp) for n in self.layout.seqlens)

    def _cp_counts(self, first: int) -> list[tuple[int, int]]:
        """Per sample (start in the sample, real tokens) of the cp ranks first .. first + inner - 1."""
        cp = self.size * self.inner

        def start(q: int, n: int) -> int:  # where cp rank q's piece of a sample of n tokens begins
            return q * (n // cp) + min(q, n % cp)

        return [
            (start(first, n), start(first + self.inner, n) - start(first, n)) for n in self.layout.seqlens
        ]

    def local_counts(self, rank: int | None = None) -> tuple[int, ...]:
        r = self.rank if rank is None else rank
        return tuple(count for _, count in self._cp_counts(r * self.inner))

    def row_index(self, device: torch.device | str = "cpu", rank: int | None = None) -> torch.Tensor:
        r = self.rank if rank is None else rank

        def build() -> torch.Tensor:
            parts = []
            for offset, c, (start, count) in zip(
                self.layout.offsets[:-1], self.chunk_lens, self._cp_counts(r * self.inner), strict=True
            ):
                within = torch.arange(c)
                parts.append(torch.where(within < count, offset + start + within, -1))
            return torch.cat(parts).to(device)

        return self._cached(("row", r, str(device)), build)


def group_order(shard: TokenShard, inner: int, device: torch.device) -> torch.Tensor:
    """(inner x local,) for each token of the `GroupShard`, its position in the Ulysses all-to-all's
    (gathered) order: the group's ranks' tokens by rank. A stable sort by (sample, is pad) keeps the real
    tokens of a sample in rank order, hence row order."""
    first = shard.rank // inner * inner
    sample = shard.token_sample(device).repeat(inner)
    pad = ~torch.cat([shard.valid(device, first + j) for j in range(inner)])
    return torch.argsort(sample * 2 + pad.long(), stable=True)


@dataclass(frozen=True)
class UspGroups:
    """This rank's two sub-groups of its cp group (`ParallelDims.cp_2d_groups`)."""

    ulysses: dist.ProcessGroup
    ring: dist.ProcessGroup


def ulysses_degree(shard: TokenShard, heads: int, groups: UspGroups | None) -> int:
    """The Ulysses group's size, after checking that the groups split the shard's cp ranks and the heads."""
    if groups is None:
        raise UserInputError(
            "parallel.cp_impl=usp needs the Ulysses and ring groups (ParallelDims.cp_2d_groups)"
        )
    inner = dist.get_world_size(groups.ulysses)
    if inner * dist.get_world_size(groups.ring) != shard.size:
        raise UserInputError(
            f"parallel.cp_ulysses={inner} x the ring's {dist.get_world_size(groups.ring)} ranks must equal "
            f"the cp={shard.size} the TokenShard splits over; make the groups with ParallelDims.cp_2d_groups"
        )
    if heads % inner:
        raise UserInputError(
            f"parallel.cp_impl=usp splits the {heads} attention heads (per tensor-parallel rank) over "
            f"cp_ulysses={inner} ranks; make model.heads / parallel.tp divisible by parallel.cp_ulysses"
        )
    return inner


def usp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    shard: TokenShard,
    group: dist.ProcessGroup,
    backend: str = "sdpa",
    sdpa_backend: str = "auto",
    groups: UspGroups | None = None,
) -> torch.Tensor:
    """2D context-parallel attention (see the module docstring): q, k, v are this rank's tokens
    (B, local, H, D) of the row `shard` splits over `group` (the whole cp group); `groups` its Ulysses
    and ring sub-groups. Returns this rank's output (B, local, H, Dv)."""
    inner = ulysses_degree(shard, q.shape[2], groups)
    if inner == 1:
        return ring_attention(q, k, v, shard, groups.ring, backend, sdpa_backend)
    if inner == shard.size:
        return ulysses_attention(q, k, v, shard, groups.ulysses, backend, sdpa_backend)
    dims = (q.shape[-1], k.shape[-1], v.shape[-1])
    qkv = heads_to_tokens(torch.cat([q, k, v], dim=-1), groups.ulysses)  # one all-to-all for all three
    order = group_order(shard, inner, q.device)
    qg, kg, vg = qkv.index_select(1, order).split(dims, dim=-1)
    out = ring_attention(qg, kg, vg, GroupShard.of(shard, inner), groups.ring, backend, sdpa_backend)
    return tokens_to_heads(out.index_select(1, torch.argsort(order)), groups.ulysses)

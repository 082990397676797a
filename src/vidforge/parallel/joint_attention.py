"""Context parallel for joint attention (MM-DiT: HunyuanVideo-1.5's double-stream blocks): one attention
over [video tokens, caption tokens] where only the video tokens are split over the cp ranks
(`TokenShard`) and every rank holds the whole caption stream (it is short, and each rank's video tokens
read all of it). q, k and v are (B, local + L, H, D): this rank's video tokens, then the L caption tokens
(the same on every rank); the output is laid out the same way. `JointShard` is the mask the family hands
its attention; `ContextParallelAttend` (`apply_cp`) evaluates it with `joint_attention`.

- all-gather: the video K/V of every rank gathered in row order (pads dropped), the caption's appended;
  every rank's queries, its video tokens and the whole caption, attend to that. The caption's outputs are
  then the same on every rank, each rank's computed from the same numbers.
- ulysses: one all-to-all turns the video q/k/v into (every video token, this rank's H/cp heads); the
  caption's q/k/v are sliced to the same heads; attention runs over [video, caption] for those heads; the
  video part goes back by the inverse all-to-all, the caption part is all-gathered over the heads.

Gradients: every rank backpropagates its share of the loss (`shard_loss`); the caption stream is
replicated, so its gradients on one rank hold that rank's share only, and the gathers' backwards (a
reduce-scatter: a sum over ranks) and FSDP's reduction over cp add the shares up to the single-process
gradient. The ring and usp would need the caption's keys merged into the ring's blocks once (not once
per rank): not built, so a family that uses joint attention refuses them at load (`JOINT_CP_IMPLS`),
and parallel.cp_regather with them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from vidforge.attention.dispatch import attention
from vidforge.errors import UserInputError
from vidforge.families import JOINT_CP_IMPLS
from vidforge.parallel.cp_attention import gather_tokens, heads_to_tokens, tokens_to_heads
from vidforge.tokens import ContextShard, KeyPadding


@dataclass(eq=False)
class JointShard(ContextShard):
    """Joint attention's mask under context parallel: `shard` splits the video tokens, `keys` (B, L) bool
    says which of the L replicated tokens after them are keys (the caption's padding masked out)."""

    keys: torch.Tensor

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.shard.packed:
            raise ValueError("JointShard splits a plain batch's video tokens; packed rows are not built")
        if self.keys.ndim != 2 or self.keys.dtype != torch.bool:
            raise ValueError(
                f"JointShard.keys must be (B, L) bool, got {self.keys.dtype} {tuple(self.keys.shape)}"
            )


def _key_mask(mask: JointShard, video: int) -> KeyPadding:
    """Every video key of the row (`video` of them, the gathered real ones) and the valid caption keys."""
    ones = torch.ones((mask.keys.shape[0], video), dtype=torch.bool, device=mask.keys.device)
    return KeyPadding(torch.cat([ones, mask.keys], dim=1))


def joint_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: JointShard,
    group: dist.ProcessGroup,
    impl: str,
    backend: str = "sdpa",
    sdpa_backend: str = "auto",
    regather: bool = False,
) -> torch.Tensor:
    """Joint attention over a row whose video tokens `mask.shard` splits over `group` (module docstring)."""
    if impl == "all-gather":
        return _all_gather(q, k, v, mask, group, backend, sdpa_backend, regather)
    if impl == "ulysses":
        return _ulysses(q, k, v, mask, group, backend, sdpa_backend)
    raise UserInputError(
        f"parallel.cp_impl={impl}: joint attention (video and caption tokens in one attention) runs under "
        f"parallel.cp_impl {' or '.join(JOINT_CP_IMPLS)}; set one of them"
    )


def _all_gather(q, k, v, mask: JointShard, group, backend, sdpa_backend, regather) -> torch.Tensor:
    if regather:
        # Re-gathering in the backward (the gather under selective checkpointing, `cp_attention._regathered`)
        # meets an op in the recompute of SDPA's key-padded path that the forward did not record (a copy),
        # which torch's checkpoint refuses.
        raise UserInputError(
            "parallel.cp_regather: joint attention keeps the gathered video K/V for its backward (re-gathering "
            "is not built for it); set parallel.cp_regather=false"
        )
    shard, local = mask.shard, mask.shard.local
    dk = k.shape[-1]
    kv = shard.assemble(gather_tokens(torch.cat([k[:, :local], v[:, :local]], dim=-1), group))
    k_video, v_video = kv.split([dk, kv.shape[-1] - dk], dim=-1)  # the real video keys in row order
    k_all, v_all = torch.cat([k_video, k[:, local:]], dim=1), torch.cat([v_video, v[:, local:]], dim=1)
    return attention(q, k_all, v_all, _key_mask(mask, shard.total), backend, sdpa_backend)


def _ulysses(q, k, v, mask: JointShard, group, backend, sdpa_backend) -> torch.Tensor:
    shard, local = mask.shard, mask.shard.local
    size, rank, heads = shard.size, dist.get_rank(group), q.shape[2]
    if heads % size:
        raise UserInputError(
            f"parallel.cp_impl=ulysses splits the {heads} attention heads over cp={size} ranks; make "
            "model.heads divisible by parallel.cp, or use parallel.cp_impl=all-gather"
        )
    dims = (q.shape[-1], k.shape[-1], v.shape[-1])
    video = heads_to_tokens(torch.cat([q[:, :local], k[:, :local], v[:, :local]], dim=-1), group)
    qv, kv, vv = video.split(dims, dim=-1)  # every rank's video tokens (gathered order), my heads
    real = shard.gathered_row_index(q.device)  # the real video keys, in row order
    mine = slice(rank * (heads // size), (rank + 1) * (heads // size))  # heads_to_tokens gives rank r group r
    caption = [t[:, local:, mine] for t in (q, k, v)]
    out = attention(
        torch.cat([qv, caption[0]], dim=1),
        torch.cat([kv.index_select(1, real), caption[1]], dim=1),
        torch.cat([vv.index_select(1, real), caption[2]], dim=1),
        _key_mask(mask, real.shape[0]),
        backend,
        sdpa_backend,
    )
    out_video, out_caption = out.split([qv.shape[1], out.shape[1] - qv.shape[1]], dim=1)
    # the caption's heads from every rank: gathered along the heads (moved to dim 1 for gather_tokens)
    out_caption = gather_tokens(out_caption.transpose(1, 2), group).transpose(1, 2)
    return torch.cat([tokens_to_heads(out_video, group), out_caption], dim=1)

"""Activation offload (Vchitect-2.0's combination with recompute): which blocks, and the backward's prefetch
order, on the CPU path (the side-stream copies are the GPU suite's; the same hooks run here)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vidforge.memory_savers.activation_checkpoint import checkpointed_indices
from vidforge.memory_savers.activation_offload import HostOffloader, OffloadedBlock, offloaded_indices
from vidforge.profile import load_profile


@pytest.mark.parametrize("blocks", [4, 7, 28])
@pytest.mark.parametrize("ratio,offload", [(0.0, 0.5), (0.5, 0.5), (0.25, 0.5), (0.7, 0.3), (0.5, 0.0)])
def test_offloaded_and_recomputed_blocks_are_disjoint(blocks, ratio, offload) -> None:
    mode = "selective" if ratio else "none"
    recomputed = set(checkpointed_indices(blocks, mode, ratio))
    offloaded = offloaded_indices(blocks, mode, ratio, offload)
    assert not recomputed & set(offloaded)
    free = blocks - len(recomputed)
    assert len(offloaded) == min(round(offload * blocks), free)


def test_the_issue_s_example_no_longer_overlaps() -> None:
    """28 layers, selective 0.5 + offload 0.5 (full + offload is now refused): every block one or the other."""
    recomputed = set(checkpointed_indices(28, "selective", 0.5))
    offloaded = set(offloaded_indices(28, "selective", 0.5, 0.5))
    assert recomputed | offloaded == set(range(28)) and not recomputed & offloaded


def test_the_profile_refuses_more_offloaded_and_recomputed_blocks_than_there_are() -> None:
    with pytest.raises(ValueError, match="activation_offload"):
        load_profile(None, ["train.activation_checkpointing=full", "train.activation_offload=0.5"])
    with pytest.raises(ValueError, match="activation_offload"):
        load_profile(None, ["train.activation_checkpointing=selective", "train.checkpoint_ratio=0.75",
                            "train.activation_offload=0.5"])  # fmt: skip
    load_profile(None, ["train.activation_checkpointing=selective", "train.activation_offload=0.5"])


def test_checkpoint_offload_needs_blocks_that_recompute() -> None:
    with pytest.raises(
        ValueError, match="train.checkpoint_offload=true: offloads the inputs that recomputing blocks keep"
    ):
        load_profile(None, ["train.checkpoint_offload=true"])
    load_profile(None, ["train.activation_checkpointing=full", "train.checkpoint_offload=true"])


class Recording(HostOffloader):
    """The product's offloader, logging when each stash is fetched and first read."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, int]] = []
        self.ids: dict[int, int] = {}
        self.left_in_place: list[torch.Tensor] = []

    def pack(self, stash, t):
        self.ids.setdefault(id(stash), len(self.ids))
        packed = super().pack(stash, t)
        if isinstance(packed, torch.Tensor):
            self.left_in_place.append(packed)
        return packed

    def _fetch(self, stash) -> None:
        self.log.append(("fetch", self.ids[id(stash)]))
        super()._fetch(stash)

    def unpack(self, packed):
        if not isinstance(packed, torch.Tensor) and ("read", self.ids[id(packed[0])]) not in self.log:
            # logged before the offloader acts on it: the backward asks for this block's first tensor
            self.log.append(("read", self.ids[id(packed[0])]))
        return super().unpack(packed)


def _blocks(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)) for _ in range(4)))


def test_backward_prefetches_the_previous_block_and_gives_the_same_gradients() -> None:
    plain, offloaded = _blocks(), _blocks()
    offloader = Recording()
    for i in range(4):
        offloaded[i] = OffloadedBlock(offloaded[i], offloader)
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    plain.double(), offloaded.double()
    plain(x * 1).square().sum().backward()  # x * 1: a block input is an activation, not a leaf
    offloaded(x * 1).square().sum().backward()
    for (name, p), q in zip(plain.named_parameters(), offloaded.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name
    # the backward meets block 3 first: it fetches 3, then at once 2 (prefetch) before reading 3, ...
    reads = [i for what, i in offloader.log if what == "read"]
    assert reads == [3, 2, 1, 0]
    log = offloader.log
    assert log.index(("read", 3)) < log.index(("fetch", 3))  # nothing to prefetch it: fetched on demand
    for block in (2, 1, 0):  # fetched when the backward reached the block after it, before it is read
        assert log.index(("read", block + 1)) < log.index(("fetch", block)) < log.index(("read", block))
    assert sorted(log) == sorted({*log})  # each block fetched and first read once
    # the two weights of each block stay where they are; only activations were stashed
    weights = {p.untyped_storage().data_ptr() for p in offloaded.parameters() if p.dim() == 2}
    assert len(weights) == 8
    assert {t.untyped_storage().data_ptr() for t in offloader.left_in_place} == weights
    assert offloader._waiting == []  # every stash left the queue when its backward ran


class Attention(nn.Module):
    """A block whose backward reads what SDPA saved (on a GPU: its dropout seed and offset on the host,
    beside the activations on the device)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, 4)).unbind(-3)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).flatten(-2)


def test_host_saved_tensors_come_back_as_their_host_copies_without_a_stream() -> None:
    """The CPU side of the GPU crash (record_stream on a host-saved scalar): a tensor saved on the host
    is handed back as the host copy itself, and no side stream is made for it. The GPU path, where a
    stash mixes device and host tensors, is the GPU suite's (test_activation_checkpointing_and_offload)."""
    torch.manual_seed(0)
    plain = Attention()
    offloaded = OffloadedBlock(Attention(), offloader := HostOffloader())
    offloaded.load_state_dict(plain.state_dict())
    x = torch.randn(2, 5, 8, requires_grad=True)
    fetched = []
    real_fetch = HostOffloader._fetch

    def fetch(self, stash):
        real_fetch(self, stash)
        fetched.append([a is b for a, b in zip(stash.fetched, stash.host, strict=True)])

    offloader._fetch = fetch.__get__(offloader)
    plain(x * 1).square().sum().backward()
    offloaded(x * 1).square().sum().backward()
    assert fetched and all(all(same) for same in fetched)
    assert offloader._stream is None
    for (name, p), q in zip(plain.named_parameters(), offloaded.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=name)

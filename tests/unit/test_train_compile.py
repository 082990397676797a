"""torch.compile over every training path: each block runs as a compiled graph, with no graph break and
no recompile between steps of one shape, and the compiled step's losses equal eager's. Counted with
dynamo's own counters; compiled with AOTAutograd and the eager backend (the graphs inductor would get,
without minutes of C++ codegen on the CPU: `VIDFORGE_TEST_INDUCTOR=1` in test_train_options runs inductor)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from vidforge.bench.train_bench import BenchStep
from vidforge.profile import load_profile

TINY_WAN = {
    "model.preset": "wan2.1-1.3b",
    "diffusion.objective": "flow",
    "model.layers": 2,
    "model.hidden": 64,
    "model.heads": 2,
    "model.mlp_hidden": 128,
    "model.text_dim": 16,
    "cluster.accelerator": "cpu",
    "bench.latent_frames": 2,
    "bench.latent_height": 8,
    "bench.latent_width": 8,
    "bench.text_tokens": 8,
    "train.precision": "fp32",
}

PATHS = {
    "packed-none": {},
    "packed-selective": {"train.activation_checkpointing": "selective"},
    "packed-full": {"train.activation_checkpointing": "full"},
    # one block at op level (torch's selective checkpoint, its policy's cache), one in full
    "op-level-and-full": {"train.activation_checkpointing": "selective", "train.checkpoint_ratio": 0.5,
                          "train.checkpoint_ops_ratio": 0.5},
    "plain-full": {"train.activation_checkpointing": "full", "data.packing": False},
    "offload": {"train.activation_offload": 1.0},
    "selective-offload": {"train.activation_checkpointing": "selective", "train.activation_offload": 0.5},
    "lora-full": {"train.activation_checkpointing": "full", "train.lora.rank": 4},
    # block swap around the compiled block (its weights repointed between calls: graph inputs, no guard)
    "lora-swap": {"train.lora.rank": 4, "train.lora.blocks_to_swap": 1},
    "lora-full-checkpoint-offload-swap": {"train.activation_checkpointing": "full", "train.lora.rank": 4,
                                          "train.checkpoint_offload": True, "train.lora.blocks_to_swap": 1},
    "dit-full": {"model.preset": "tiny", "diffusion.objective": "edm", "model.in_channels": 16,
                 "train.activation_checkpointing": "full"},
}  # fmt: skip


def _losses(sets: dict, steps: int, after_each=None) -> list[float]:
    profile = load_profile("dit1b_1xh200", [f"{k}={v}" for k, v in {**TINY_WAN, **sets}.items()])
    torch.manual_seed(0)
    bench = BenchStep(profile)
    out = []
    for _ in range(steps):
        out.append(bench.step(bench.batches).loss)
        bench.step.apply()
        if after_each:
            after_each()
    return out


@pytest.mark.parametrize("path", list(PATHS))
def test_every_training_path_compiles_whole_blocks_once(path, monkeypatch) -> None:
    sets = PATHS[path]
    eager = _losses(sets, 2)

    real = torch.compile
    compiled: list[object] = []

    def aot_eager(module, **kwargs):
        compiled.append(module)
        return real(module, backend="aot_eager", **kwargs)

    monkeypatch.setattr(torch, "compile", aot_eager)
    torch._dynamo.reset()
    counters.clear()
    graphs: list[int] = []
    got = _losses(
        {**sets, "train.compile": True}, 2, lambda: graphs.append(counters["stats"]["unique_graphs"])
    )

    assert len(compiled) == 2, "every block compiled"
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert graphs[0] >= 1, "a compiled graph ran"
    assert graphs[1:] == graphs[:1], f"recompiled between steps of one shape: graphs after each step {graphs}"
    assert got == pytest.approx(eager, rel=0, abs=1e-5)


def test_flash_and_flex_masks_are_made_before_the_blocks_run() -> None:
    """The device tensors the flash and flex backends read are made by `condition`, outside the compiled
    blocks: filling them inside a checkpointed block is the side effect that broke its graph."""
    from vidforge.models import build_model, pack_latents
    from vidforge.tokens import Segments

    profile = load_profile(
        None, ["model.attention=flex", "model.hidden=64", "model.in_channels=4", "model.patch=[1,2,2]"]
    )
    model = build_model(profile.model)
    tokens, layout = pack_latents([torch.randn(4, 2, 8, 8), torch.randn(4, 2, 4, 8)], profile.model.patch)
    cond = model.condition(torch.rand(2), torch.randn(2, 8, profile.model.text_dim), layout=layout)
    masks = [scope.mask for scope in cond.scopes.values()] + [cond.text_mask]
    assert masks and all(isinstance(m, Segments) for m in masks)
    for mask in masks:
        made = dict(mask._cache)  # before any backend asks
        cu, doc = mask.cu_seqlens(tokens.device), mask.document_ids(tokens.device)
        assert made.get(("cu", "cpu")) is cu and made.get(("doc", "cpu")) is doc
        assert cu[0].tolist() == [0, *torch.tensor(mask.q_lens).cumsum(0).tolist()]

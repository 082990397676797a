"""FSDP2's bf16 mixed precision (`parallel.fsdp.apply_fsdp`) keeps one process's numerics: the RoPE tables
every family's network computes in float32 (diffusers computes RoPE in float32) reach its blocks in float32,
as they do in one process under bf16 autocast, and the network's own inputs (the noise level its timestep
sinusoids read at 1000 x t) stay float32 too. FSDP2's `cast_forward_inputs` (on by default) casts every
floating-point argument of a wrapped module's forward, a dataclass's fields included, to param_dtype: with
it the blocks saw bf16 tables (and Wan's float32 timestep rows in bf16), the root a bf16 noise level, and
these networks' outputs were measured 33% (the DiT), 66% (Wan), 53% (HunyuanVideo-1.5) and 49% (LTX-2) off
one process's, mostly from the noise level; without it, under the trainer's autocast
(`parallelize.autocast_dtype`), 0.7% to 1.0% (FSDP2's bf16 copies of the norm and modulation weights, which
one process reads in float32).

One gloo process is enough: the cast happens on the way into each module, whatever the shard count. Each
family's tiny network (float32 master weights, perturbed off their initialisation so the output is not 0)
runs the trainer's forward: FSDP2 with param_dtype bf16 under autocast to the profile's compute dtype, a
forward pre-hook on every block recording the dtypes of the tables it receives and of the weights FSDP2
gathered for it. Validation autocasts to `parallelize.forward_dtype`: the profile's dtype for an FSDP2
model, held here to the dtype of the weights FSDP2 actually gathered."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranks import run_ranks  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

FAMILIES = ("vidforge", "wan", "hunyuan15", "ltx2")
TOL = 0.05  # measured 0.7% to 1.0% (bf16 norm and modulation weights); with the cast 33% to 66%
GRID = (3, 3, 5)  # the token families' latent grid (patch 1x1x1): 45 tokens


def _network(name: str) -> torch.nn.Module:
    from vidforge.models import build_model
    from vidforge.models.presets import model_config

    if name == "hunyuan15":
        from vidforge.families.hunyuan15.model import HunyuanVideo15Model

        cfg = HunyuanVideo15Model(
            layers=2, hidden=32, heads=2, mlp_hidden=80, refiner_layers=1, in_channels=4, condition_channels=5,
            text_dim=24, text_2_dim=12, text_2_tokens=5, image_dim=20, rope_axes=(4, 6, 6),
        )  # fmt: skip
    elif name == "ltx2":
        from vidforge.families.ltx2.model import LTX2Model

        cfg = LTX2Model(layers=2, hidden=48, heads=2, mlp_hidden=192, in_channels=8, text_dim=16)
    elif name == "wan":
        cfg = model_config(
            "tiny", family="wan", mlp_act="gelu-tanh", adaln_lora_rank=0, abs_position="none",
            cross_attn_norm=True, hidden=48, heads=4, mlp_hidden=96, text_dim=16,
        )  # fmt: skip
    else:
        cfg = model_config("tiny")
    torch.manual_seed(0)
    model = build_model(cfg, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # off the initialisation (a zero final layer), so the output is not 0
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


def _inputs(model: torch.nn.Module) -> tuple[tuple, dict]:
    """A plain batch of 2: latents (the DiT and Wan) or patch tokens (the others), levels, a caption with
    sample 1's padded, and HunyuanVideo-1.5's image-to-video inputs."""
    cfg = model.config
    g = torch.Generator().manual_seed(2)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    level, text = torch.rand(2, generator=g), torch.randn(2, 9, cfg.text_dim, generator=g)
    if cfg.family in ("vidforge", "wan"):
        return (torch.randn(2, cfg.in_channels, 2, 4, 4, generator=g), level, text, mask), {}
    tokens = GRID[0] * GRID[1] * GRID[2]
    kwargs = {"text_mask": mask, "grid": GRID}
    if cfg.family == "hunyuan15":
        kwargs["condition"] = torch.randn(2, tokens, cfg.condition_channels, generator=g)
        kwargs["image"] = torch.randn(2, 9, cfg.image_dim, generator=g)
    return (torch.randn(2, tokens, cfg.in_channels, generator=g), level, text), kwargs


def _record_tables(model: torch.nn.Module) -> tuple[list[torch.dtype], set[torch.dtype]]:
    """The dtypes of the RoPE tables every block's forward receives (its conditioning's `rope`) and of the
    block's floating-point weights, as a forward pre-hook registered after FSDP2's own sees them (FSDP2's
    gathered weights in its param_dtype)."""
    seen: list[torch.dtype] = []
    weights: set[torch.dtype] = set()

    def hook(module, args, kwargs):
        seen.extend(table.dtype for table in args[1].rope)
        weights.update(p.dtype for p in module.parameters() if p.is_floating_point())

    for block in model.blocks.values():
        block.register_forward_pre_hook(hook, with_kwargs=True)
    return seen, weights


def _worker(rank: int, world: int) -> dict[str, dict]:
    from torch.distributed.device_mesh import init_device_mesh

    from vidforge.parallel.fsdp import apply_fsdp
    from vidforge.parallel.parallelize import autocast_dtype, compute_dtype, forward_dtype
    from vidforge.profile import load_profile

    profile = load_profile("local_cpu", ["train.precision=bf16"])
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    found = {}
    for name in FAMILIES:
        model = _network(name)
        args, kwargs = _inputs(model)
        one, _ = _record_tables(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # one process: fp32 weights, bf16 autocast
            want = model(*args, **kwargs).detach().float()
        unwrapped = forward_dtype(model, profile)
        model = _network(name)
        apply_fsdp(model, mesh, model.blocks, param_dtype=compute_dtype(profile))
        tables, gathered = _record_tables(model)
        with torch.autocast("cpu", dtype=autocast_dtype(profile)):  # the trainer's forward (train.step)
            got = model(*args, **kwargs).detach().float()
        found[name] = {
            "one process": sorted({str(t) for t in one}),
            "fsdp2": sorted({str(t) for t in tables}),
            "blocks": len(tables) // 2,
            "forward dtype": str(forward_dtype(model, profile)),
            "gathered": sorted(str(d) for d in gathered),
            "unwrapped forward dtype": str(unwrapped),
            "error": float((got - want).abs().max() / want.abs().max()),
        }
    return found


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    return run_ranks(_worker, 1)[0]


@pytest.mark.parametrize("name", FAMILIES)
def test_fsdp2_bf16_blocks_receive_float32_rope_tables(results, name) -> None:
    found = results[name]
    assert found["one process"] == ["torch.float32"]  # what the network makes and one process keeps
    assert found["fsdp2"] == ["torch.float32"] and found["blocks"] == 2  # every block's, under bf16 FSDP2
    # what validation autocasts an FSDP2 model to: the weights FSDP2 gathered, bf16 as training's forward
    assert found["gathered"] == [found["forward dtype"]] == ["torch.bfloat16"]
    assert found["unwrapped forward dtype"] == "None"  # one process: its fp32 weights as they are
    assert found["error"] < TOL

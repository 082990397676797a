"""HunyuanVideo-1.5 and LTX-2 (the video path) under context parallel and FSDP2 on 2 gloo ranks against one
process, at the module level: every rank builds the same tiny float64 network and the same plain batch,
takes the single-process loss and gradients as the reference, then runs the context-parallel copy on
its share of the video tokens (`TokenShard`: 3 x 3 x 5 = 45 tokens a sample, so rank 1 holds a pad).

HunyuanVideo-1.5 attends over [video, caption] (and the image tokens in front of the caption for I2V):
only the video tokens are split, the caption stream is on every rank (`parallel.joint_attention`:
all-gather, Ulysses, the ring, whose caption keys must enter every softmax once, and, on 4 ranks with
VIDFORGE_TEST_ALL_LAYOUTS=1, usp: Ulysses 2 x ring 2, which pads 3 of the 45 tokens). LTX-2 is full self-attention over the video with its own RoPE (fractional
pixel-space positions, "split" pairs): each rank's table must come from its tokens' global positions.

Checked per case: the gathered output equals the single-process output, the ranks' `shard_loss` shares
sum to the single-process loss, and the parameters' gradients summed over the ranks equal the
single-process ones; under FSDP2 over the cp ranks (as the trainer composes them) the reduced gradients
equal them too. float64: the computations differ in summation order only, so 1e-10 bounds the output
and loss (a missing key, a wrong RoPE position or a caption counted twice is O(1e-2)). Gradients 1e-8:
both families rotate q and k in float32 whatever the dtype (the reference's rule), so the rotation's
backward rounds gradients that differ in the 16th digit to float32, now and then one ulp apart (6e-8
relative; ~3e-10 seen). Under FSDP2 1e-6: its mixed
precision casts every block's inputs to param_dtype, the float32 RoPE tables in the conditioning
included, so there the blocks rotate in float64 and the single process in float32 (differences ~1e-7).
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranks import run_ranks  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SHAPE = (3, 3, 5)  # latent frames, height, width: 45 tokens with patch 1x1x1, odd, so cp=2 pads one
TOL = 1e-10
GRAD_TOL = 1e-8
FSDP_TOL = 1e-6


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # off the initialisation (zeros, ones), so every parameter matters
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _hunyuan15():
    from vidforge.families.hunyuan15.model import HunyuanVideo15Model
    from vidforge.models import build_model

    cfg = HunyuanVideo15Model(
        layers=2, hidden=32, heads=2, mlp_hidden=80, refiner_layers=1, in_channels=4, condition_channels=5,
        text_dim=24, text_2_dim=12, text_2_tokens=5, image_dim=20, rope_axes=(4, 6, 6),
    )  # fmt: skip
    torch.manual_seed(0)
    return _perturbed(build_model(cfg, dtype=torch.float64))


def _ltx2(rope_type: str = "split"):
    """LTX-2.3's block (gated attention, prompt modulation) with "split" RoPE; LTX-2's "interleaved" too."""
    from vidforge.families.ltx2.model import LTX2Model
    from vidforge.models import build_model

    cfg = LTX2Model(
        layers=2, hidden=48, heads=2, mlp_hidden=192, in_channels=8, text_dim=16, rope_type=rope_type,
        prompt_modulation=True, gated_attention=True,
    )  # fmt: skip
    torch.manual_seed(0)
    return _perturbed(build_model(cfg, dtype=torch.float64))


def _inputs(model, image: bool, token_levels: bool) -> dict:
    """A plain batch of 2 as patch tokens: noisy tokens, target, noise level, caption (sample 1's padded),
    and for I2V the condition tokens and image embedding; `token_levels`: a level per token, the first
    frame's 0 (image-to-video's first-frame conditioning)."""
    cfg = model.config
    g = torch.Generator().manual_seed(2)
    tokens = SHAPE[0] * SHAPE[1] * SHAPE[2]

    def draw(*size):
        return torch.randn(*size, generator=g, dtype=torch.float64)

    length = 9
    mask = torch.ones(2, length, dtype=torch.bool)
    mask[1, 6:] = False
    level = torch.rand(2, generator=g, dtype=torch.float64)
    if token_levels:
        level = level[:, None].expand(2, tokens).clone()
        level[:, : SHAPE[1] * SHAPE[2]] = 0.0
    inp = {
        "x": draw(2, tokens, cfg.in_channels),
        "target": draw(2, tokens, cfg.in_channels),
        "noise_level": level,
        "text": draw(2, length, cfg.text_dim),
        "text_mask": mask,
    }
    if image:
        inp["condition"] = draw(2, tokens, cfg.condition_channels)
        inp["image"] = draw(2, 9, cfg.image_dim)
    return inp


def _run(model, inp: dict, shard=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, per-element squared error) on the full row, or on this rank's tokens under `shard`."""
    kwargs = {k: inp[k] for k in ("text_mask", "condition", "image") if k in inp}
    x, target, level = inp["x"], inp["target"], inp["noise_level"]
    if shard is None:
        kwargs["grid"] = SHAPE
    else:
        x, target = shard.split(x), shard.split(target)
        kwargs["condition"] = shard.split(kwargs["condition"]) if "condition" in kwargs else None
        level = shard.split(level[..., None])[..., 0] if level.ndim == 2 else level
        kwargs["shard"] = shard
    out = model(x, level, inp["text"], **kwargs)
    return out, (out - target).square()


def _case(model, inp: dict, group, impl: str, fsdp_mesh=None) -> dict[str, float]:
    """Errors of the cp run against one process: output, loss, gradients."""
    import torch.distributed as dist

    from vidforge.parallel.context_parallel import apply_cp, gather_row, shard_loss, shard_of
    from vidforge.parallel.fsdp import apply_fsdp

    reference = copy.deepcopy(model)
    out, squared = _run(reference, inp)
    squared.mean().backward()

    cp_model = apply_cp(copy.deepcopy(model), group, impl)
    if fsdp_mesh is not None:
        apply_fsdp(
            cp_model, fsdp_mesh, cp_model.blocks, param_dtype=torch.float64, reduce_dtype=torch.float64
        )
    shard = shard_of(SHAPE, group)
    local, squared_local = _run(cp_model, inp, shard)
    share = shard_loss(squared_local, shard)
    # FSDP averages over its ranks: backpropagate cp x the share there (see shard_loss)
    (share * (shard.size if fsdp_mesh is not None else 1)).backward()
    loss = share.detach().clone()
    dist.all_reduce(loss, group=group)
    errors = {
        "output": (gather_row(local.detach(), shard, group) - out.detach()).abs().max().item(),
        "loss": abs(loss.item() - squared.mean().item()),
        "grad": 0.0,
    }
    grads = dict(cp_model.named_parameters())
    for name, p in reference.named_parameters():
        mine = grads[name].grad
        if p.grad is None:  # unused here (T2V's image projection): unused under cp too
            errors["grad"] = max(errors["grad"], 0.0 if mine is None else float("inf"))
            continue
        if fsdp_mesh is not None:
            mine = mine.full_tensor()
        else:
            mine = mine.clone()
            dist.all_reduce(mine, group=group)
        errors["grad"] = max(errors["grad"], (mine - p.grad).abs().max().item())
        errors["grad_scale"] = max(errors.get("grad_scale", 0.0), p.grad.abs().max().item())
    return errors


def _sampling(model, group, impl: str) -> float:
    """Largest difference between context-parallel and single-process sampled latents (text-to-video, 3
    flow steps with guidance against a negative prompt, as the families' pipelines sample)."""
    from vidforge.parallel.context_parallel import apply_cp
    from vidforge.profile import load_profile
    from vidforge.sampling.latents import sample_latents, sample_latents_cp

    profile = load_profile(None, ["diffusion.objective=flow", "diffusion.steps=3", "diffusion.guidance=3.0"])
    g = torch.Generator().manual_seed(3)
    cfg = model.config
    text = torch.randn(2, 6, cfg.text_dim, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    negative = (torch.randn(1, 6, cfg.text_dim, generator=g, dtype=torch.float64), mask[:1])
    shape = (cfg.in_channels, *SHAPE)
    single = sample_latents(model, profile, text, mask, [5, 6], shape, negative)
    cp = sample_latents_cp(
        apply_cp(copy.deepcopy(model), group, impl), profile, text, mask, [5, 6], shape, group, negative
    )
    return (cp - single).abs().max().item()


def _joint_ring_attention(group) -> dict[str, float]:
    """The joint ring alone on the einsum kernel (`model.attention=dense`; the model cases run the CPU flash
    kernel): random q, k, v over [45 video tokens, 9 caption tokens], row 1's caption keys with holes, against
    softmax attention written out; output and the gradients of q, k, v (the caption's summed over ranks, each
    rank weighing its copy of the caption's output 1/cp)."""
    import torch.distributed as dist

    from vidforge.parallel.context_parallel import shard_of
    from vidforge.parallel.joint_attention import JointShard, joint_attention

    g = torch.Generator().manual_seed(4)
    video, length = SHAPE[0] * SHAPE[1] * SHAPE[2], 9
    q, k, v, weight = (
        torch.randn(2, video + length, 2, 8, generator=g, dtype=torch.float64) for _ in range(4)
    )
    keys = torch.ones(2, length, dtype=torch.bool)
    keys[1, [1, 4, 5, 8]] = False
    full = [x.clone().requires_grad_() for x in (q, k, v)]
    scores = torch.einsum("bqhd,bkhd->bhqk", full[0], full[1]) / 8**0.5
    seen = torch.cat([torch.ones(2, video, dtype=torch.bool), keys], dim=1)[:, None, None]
    out = torch.einsum("bhqk,bkhd->bqhd", scores.masked_fill(~seen, float("-inf")).softmax(-1), full[2])
    (out * weight).sum().backward()

    shard = shard_of(SHAPE, group)

    def mine(x):  # this rank's video tokens, then the caption
        return torch.cat([shard.split(x[:, :video]), x[:, video:]], dim=1)

    local = [mine(x).detach().requires_grad_() for x in (q, k, v)]
    got = joint_attention(*local, JointShard("full", shard, keys), group, "ring", backend="dense")
    share = weight[:, video:] / shard.size
    (
        (got[:, : shard.local] * shard.split(weight[:, :video])).sum() + (got[:, shard.local :] * share).sum()
    ).backward()
    valid = torch.cat([shard.valid(), torch.ones(length, dtype=torch.bool)])
    errors = {"output": (got - mine(out))[:, valid].abs().max().item()}
    for name, x, reference in zip("qkv", local, full, strict=True):
        caption = x.grad[:, shard.local :].contiguous()
        dist.all_reduce(caption, group=group)
        grad = torch.cat([x.grad[:, : shard.local], caption], dim=1)
        errors[f"grad {name}"] = (grad - mine(reference.grad))[:, valid].abs().max().item()
    errors["grad_scale"] = min(x.grad.abs().max().item() for x in full)
    return errors


# name -> (model builder, cp_impl [and the model's variant], I2V inputs, per-token levels, under FSDP2)
CASES = {
    "hunyuan15-t2v-all-gather": (_hunyuan15, "all-gather", False, False, False),
    "hunyuan15-i2v-all-gather-fsdp": (_hunyuan15, "all-gather", True, False, True),
    "hunyuan15-t2v-ulysses": (_hunyuan15, "ulysses", False, False, False),
    "hunyuan15-i2v-ulysses-fsdp": (_hunyuan15, "ulysses", True, False, True),
    "hunyuan15-i2v-ring": (_hunyuan15, "ring", True, False, False),
    "ltx2-all-gather": (_ltx2, "all-gather", False, False, False),
    "ltx2-ring-token-levels-fsdp": (_ltx2, "ring", False, True, True),
    "ltx2-ulysses": (_ltx2, "ulysses", False, False, False),
    "ltx2-interleaved-ring": (_ltx2, "ring interleaved", False, False, False),
}


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    group = mesh.get_group()
    models = {"hunyuan15": _hunyuan15(), "ltx2": _ltx2(), "ltx2 interleaved": _ltx2("interleaved")}
    results = {}
    for name, (build, impl, image, token_levels, fsdp) in CASES.items():
        impl, *variant = impl.split()
        model = models[" ".join([build.__name__.strip("_"), *variant])]
        inp = _inputs(model, image, token_levels)
        results[name] = _case(model, inp, group, impl, mesh if fsdp else None)
    results["joint ring attention"] = _joint_ring_attention(group)
    with torch.no_grad():
        results["hunyuan15 sampling"] = _sampling(models["hunyuan15"], group, "ulysses")
        results["hunyuan15 ring sampling"] = _sampling(models["hunyuan15"], group, "ring")
        results["ltx2 sampling"] = _sampling(models["ltx2"], group, "ring")
    return results


@pytest.fixture(scope="module")
def results():
    return run_ranks(_worker, 2)


@pytest.mark.parametrize("name", list(CASES))
def test_family_under_context_parallel_matches_one_process(results, name) -> None:
    fsdp = CASES[name][-1]
    tol, grad_tol = (FSDP_TOL, FSDP_TOL) if fsdp else (TOL, GRAD_TOL)
    for rank in results:
        errors = rank[name]
        assert errors["output"] <= tol and errors["loss"] <= tol and errors["grad"] <= grad_tol, (
            name,
            errors,
        )
        assert errors["grad_scale"] > 0.1  # gradients that are there to compare


@pytest.mark.parametrize("family", ["hunyuan15", "hunyuan15 ring", "ltx2"])
def test_context_parallel_sampling_matches_one_process(results, family) -> None:
    for rank in results:
        assert rank[f"{family} sampling"] <= TOL


def test_joint_ring_on_the_einsum_kernel_equals_attention(results) -> None:
    for rank in results:
        errors = rank["joint ring attention"]
        assert max(errors[key] for key in ("output", "grad q", "grad k", "grad v")) <= TOL, errors
        assert errors["grad_scale"] > 0.1


# usp on 4 ranks: Ulysses over pairs of consecutive ranks, the ring across the pairs (the 2D groups the
# trainer makes, `ParallelDims.cp_2d_groups`); a spawn of 4 more processes, so opt-in.
USP_CASES = {
    "hunyuan15-t2v-usp": (False, False),
    "hunyuan15-i2v-usp-fsdp": (True, True),
}


def _usp_worker(rank: int, world: int) -> dict:
    from vidforge.parallel.context_parallel import apply_cp
    from vidforge.parallel.dims import ParallelDims
    from vidforge.parallel.usp_attention import UspGroups
    from vidforge.profile.parallel import Layout

    dims = ParallelDims(Layout(pp=1, dp_replicate=1, dp_shard=1, cp=world, tp=1))
    groups = UspGroups(*dims.cp_2d_groups(2))
    cp_mesh = dims.mesh["cp"]
    model = _hunyuan15()
    results = {}
    for name, (image, fsdp) in USP_CASES.items():
        # installed first: the case's own apply_cp finds usp installed and keeps it
        installed = apply_cp(copy.deepcopy(model), cp_mesh, "usp", usp_groups=groups)
        results[name] = _case(
            installed, _inputs(model, image, False), cp_mesh.get_group(), "usp", cp_mesh if fsdp else None
        )
    with torch.no_grad():
        results["sampling"] = _sampling(
            apply_cp(copy.deepcopy(model), cp_mesh, "usp", usp_groups=groups), cp_mesh.get_group(), "usp"
        )
    return results


@pytest.mark.skipif(
    os.environ.get("VIDFORGE_TEST_ALL_LAYOUTS") != "1", reason="4 more ranks: set VIDFORGE_TEST_ALL_LAYOUTS=1"
)
def test_hunyuan15_under_usp_matches_one_process() -> None:
    results = run_ranks(_usp_worker, 4)
    for rank in results:
        for name, (_, fsdp) in USP_CASES.items():
            errors = rank[name]
            tol, grad_tol = (FSDP_TOL, FSDP_TOL) if fsdp else (TOL, GRAD_TOL)
            assert errors["output"] <= tol and errors["loss"] <= tol and errors["grad"] <= grad_tol, (
                name,
                errors,
            )
            assert errors["grad_scale"] > 0.1
        assert rank["sampling"] <= TOL

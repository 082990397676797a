"""The training loss (`DenoisingLoss`) for each objective, against closed forms: what it draws, in which
order, and how it reduces plain batches and packed rows. A network whose raw output is zero (vidforge's
DiT at initialisation: adaLN-zero) has loss mean(target^2), with the target written out per objective
from draws redone by hand in the documented order (levels, caption dropout, noise)."""

from __future__ import annotations

import pytest
import torch

from vidforge.data.batching import BucketBatch, PackedBatch
from vidforge.diffusion import EDM, build_objective
from vidforge.diffusion.flow import RectifiedFlow
from vidforge.profile import load_profile
from vidforge.tokens import pack_latents, patchify
from vidforge.train.loss import DenoisingLoss

PATCH = (1, 2, 2)


def _batches() -> tuple[BucketBatch, PackedBatch]:
    g = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 4, 2, 4, 4, generator=g, dtype=torch.float64)
    text, mask = torch.randn(2, 3, 8, generator=g), torch.ones(2, 3, dtype=torch.bool)
    plain = BucketBatch(latents, text, mask, ["a", "b"], [{}, {}])
    clips = [torch.randn(4, *s, generator=g, dtype=torch.float64) for s in [(2, 4, 4), (1, 2, 4)]]
    tokens, layout = pack_latents(clips, PATCH)
    packed = PackedBatch(tokens, layout, text, mask, ["c", "d"], [tuple(c.shape) for c in clips], 16, [])
    return plain, packed


def _expected_target(objective, batch, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target the loss must use, from the same draws redone in order: levels, dropout, noise; and the
    factor on the error (x-prediction: 1 / t, floored at 0.05; else 1)."""
    torch.manual_seed(seed)
    level = objective.sample_levels(2).double()
    torch.rand(2)  # the caption dropout draw
    if isinstance(batch, PackedBatch):
        clean = batch.tokens
        noise = torch.randn(clean.shape, dtype=clean.dtype)
        level_b = batch.layout.per_token(level)[..., None]
    else:
        noise = patchify(torch.randn(batch.latents.shape, dtype=batch.latents.dtype), PATCH)
        clean = patchify(batch.latents, PATCH)
        level_b = level[:, None, None]
    if isinstance(objective, EDM):
        sd, s = objective.sigma_data, (level_b**2 + objective.sigma_data**2).sqrt()
        target = clean * level_b / (sd * s) - noise * sd / s  # (y - c_skip x) / c_out, closed form
    elif objective.prediction == "clean":
        return clean, level, 1 / level_b.clamp(min=0.05)
    else:
        target = noise - clean  # the velocity
    return target, level, torch.ones_like(level_b)


@pytest.mark.parametrize(
    "objective",
    [EDM(), RectifiedFlow("logit-normal", 0.0, 1.0, 3.0), RectifiedFlow("uniform", prediction="clean")],
    ids=["edm", "flow", "flow-x-prediction"],
)
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_zero_network_loss_is_the_mean_squared_target(objective, packed) -> None:
    loss = DenoisingLoss(objective, caption_dropout=0.5, patch=PATCH, in_channels=4)
    batch = _batches()[int(packed)]
    torch.manual_seed(7)
    inputs = loss.draw(batch, torch.device("cpu"))
    micro = loss.reduce(torch.zeros_like(inputs.target), inputs)
    target, level, scale = _expected_target(objective, batch, seed=7)
    torch.testing.assert_close(inputs.target, target)
    error = target * scale  # x-prediction: each sample's error counts 1 / t times
    torch.testing.assert_close(micro.loss, (error**2).mean())
    torch.testing.assert_close(micro.level.double(), level)
    # per-sample losses: each sample's own mean, whatever its token count
    if packed:
        offsets = batch.layout.offsets
        expected = [(error[0, a:b] ** 2).mean() for a, b in zip(offsets, offsets[1:], strict=False)]
    else:
        expected = [(error[i] ** 2).mean() for i in range(2)]
    torch.testing.assert_close(micro.per_sample, torch.stack(expected))


def test_flow_input_is_the_interpolation_and_its_level_is_t() -> None:
    flow = RectifiedFlow("uniform", shift=1.0)
    loss = DenoisingLoss(flow, caption_dropout=0.0, patch=PATCH, in_channels=4)
    batch = _batches()[0]
    torch.manual_seed(3)
    inputs = loss.draw(batch, torch.device("cpu"))
    torch.manual_seed(3)
    t = torch.rand(2).double()
    torch.rand(2)
    noise = patchify(torch.randn(batch.latents.shape, dtype=torch.float64), PATCH)
    clean = patchify(batch.latents, PATCH)
    torch.testing.assert_close(inputs.x, (1 - t[:, None, None]) * clean + t[:, None, None] * noise)
    torch.testing.assert_close(inputs.model_kwargs["noise_level"].double(), t)


def test_the_profile_picks_the_objective_and_a_sampler_that_fits_it() -> None:
    flow = load_profile("local_cpu", ["diffusion.objective=flow", "diffusion.flow_shift=5"])
    assert flow.diffusion.sampler == "unipc"
    assert build_objective(flow.diffusion) == RectifiedFlow("logit-normal", 0.0, 1.0, 5.0)
    clean = load_profile("local_cpu", ["diffusion.objective=flow", "diffusion.flow_prediction=clean"])
    assert build_objective(clean.diffusion).prediction == "clean"
    with pytest.raises(Exception, match="flow_prediction=clean: only the flow objective has it"):
        load_profile("local_cpu", ["diffusion.flow_prediction=clean"])  # local_cpu's objective is edm
    assert isinstance(build_objective(load_profile("local_cpu").diffusion), EDM)
    with pytest.raises(
        Exception, match="heun does not sample the flow objective; use one of unipc, flow-euler"
    ):
        load_profile("local_cpu", ["diffusion.objective=flow", "diffusion.sampler=heun"])


def test_mfu_counts_model_flops_and_hfu_the_recompute() -> None:
    """Activation checkpointing reruns the blocks' forward: hardware FLOPs grow by exactly that, model
    FLOPs (MFU's numerator) do not."""
    from vidforge.models import build_model, forward_flops
    from vidforge.parallel.dims import ParallelDims
    from vidforge.parallel.runtime import Runtime
    from vidforge.train.build import TrainParts
    from vidforge.train.step import LocalTrainStep

    batch = _batches()[1]
    sets = ["model.in_channels=4", "model.patch=[1,2,2]", "model.layers=4", "model.text_dim=8"]
    flops = {}
    for mode in ("none", "full", "selective"):
        profile = load_profile("local_cpu", [*sets, f"train.activation_checkpointing={mode}"])
        parts = TrainParts([build_model(profile.model)], [], None, None)
        runtime = Runtime(0, 1, 0, torch.device("cpu"), ParallelDims(profile.layout))
        flops[mode] = LocalTrainStep(profile, runtime, parts).flops(batch)
    count = forward_flops(profile.model, batch.layout, batch.text_mask.sum(dim=1).tolist())
    assert flops["none"][0] == flops["full"][0] == flops["selective"][0] == flops["none"][1]
    assert flops["full"][1] == flops["none"][0] + count.blocks
    assert flops["selective"][1] == flops["none"][0] + round(count.blocks * 0.5)  # checkpoint_ratio 0.5


def test_the_draws_are_the_cpu_generator_s_whatever_the_device() -> None:
    """A GPU run draws what the CPU run draws: `draw` for another device ("meta": it holds no values)
    advances torch's CPU generator exactly as the CPU's draw does, so the draws came from it, and the
    CPU's draws are the ones redone by hand (`_expected_target`), bit for bit."""
    objective = RectifiedFlow("logit-normal", 0.0, 1.0, 3.0)
    loss = DenoisingLoss(objective, caption_dropout=0.5, patch=PATCH, in_channels=4)
    plain, _ = _batches()
    states, drawn = [], []
    for device in ("cpu", "meta"):
        torch.manual_seed(7)
        drawn.append(loss.draw(plain, torch.device(device)))
        states.append(torch.get_rng_state())
    assert torch.equal(states[0], states[1])
    on_cpu, on_meta = drawn
    assert on_meta.x.device.type == "meta" and on_meta.model_kwargs["drop_text"].device.type == "meta"
    target, level, _ = _expected_target(objective, plain, seed=7)
    assert torch.equal(on_cpu.level, level.float()) and torch.equal(on_cpu.target, target)
    torch.manual_seed(7)
    objective.sample_levels(2)
    assert torch.equal(on_cpu.model_kwargs["drop_text"], torch.rand(2) < 0.5)

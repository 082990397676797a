"""First-frame conditioning in training (`diffusion.image_condition`, Wan2.2 TI2V): a conditioned
sample's first latent frame enters clean with its tokens at noise level 0 and is left out of the loss,
in a plain batch and in a packed row; with the option off nothing is drawn differently."""

import pytest
import torch

from vidforge.data.batching import BucketBatch, PackedBatch
from vidforge.diffusion.flow import RectifiedFlow
from vidforge.profile import ProfileError, load_profile
from vidforge.profile.layout_rules import sequence_parallel
from vidforge.tokens import pack_latents, patchify
from vidforge.train.loss import DenoisingLoss

PATCH, C = (1, 2, 2), 4


def _loss(chance: float) -> DenoisingLoss:
    return DenoisingLoss(RectifiedFlow(sampling="uniform"), 0.0, PATCH, C, 8, chance)


def _bucket(b=2, shape=(3, 4, 4)) -> BucketBatch:
    g = torch.Generator().manual_seed(0)
    latents = torch.randn(b, C, *shape, generator=g)
    return BucketBatch(latents, torch.randn(b, 5, 8, generator=g), torch.ones(b, 5, dtype=torch.bool), [], [])


def test_plain_batch_condition_frame_is_clean_at_level_zero_and_outside_the_loss() -> None:
    batch = _bucket()
    torch.manual_seed(1)
    inputs = _loss(1.0).draw(batch, torch.device("cpu"))
    clean, per_frame = patchify(batch.latents, PATCH), 2 * 2
    levels = inputs.model_kwargs["noise_level"]
    assert levels.shape == (2, 3 * per_frame)
    assert torch.equal(levels[:, :per_frame], torch.zeros(2, per_frame))
    assert torch.equal(levels[:, per_frame:], inputs.level[:, None].expand(-1, 2 * per_frame))
    assert torch.equal(inputs.x[:, :per_frame], clean[:, :per_frame])  # the image latent, no noise
    assert not torch.equal(inputs.x[:, per_frame:], clean[:, per_frame:])
    # the loss is the mean over the other frames: any output on the condition frame gives the same
    output = torch.randn(inputs.target.shape)
    expected = (output - inputs.target)[:, per_frame:].square().mean()
    loss = _loss(1.0).reduce(output, inputs)
    torch.testing.assert_close(loss.loss, expected)
    torch.testing.assert_close(loss.per_sample, (output - inputs.target)[:, per_frame:].square().mean((1, 2)))
    output[:, :per_frame] = 1e6
    torch.testing.assert_close(_loss(1.0).reduce(output, inputs).loss, expected)


def test_packed_row_conditions_each_samples_own_first_frame() -> None:
    g = torch.Generator().manual_seed(3)
    latents = [torch.randn(C, 2, 4, 4, generator=g), torch.randn(C, 3, 2, 4, generator=g)]
    tokens, layout = pack_latents(latents, PATCH)
    batch = PackedBatch(
        tokens, layout, torch.randn(2, 5, 8, generator=g), torch.ones(2, 5, dtype=torch.bool), [], [], 64, []
    )
    torch.manual_seed(1)
    inputs = _loss(1.0).draw(batch, torch.device("cpu"))
    levels = inputs.model_kwargs["noise_level"]
    first = layout.positions("cpu")[:, 0] == 0
    sample = layout.sample_index("cpu")
    assert levels.shape == (1, layout.total)
    assert torch.equal(levels[0], torch.where(first, 0.0, inputs.level[sample]))
    assert torch.equal(inputs.x[0, first], tokens[0, first])
    output = torch.randn(inputs.target.shape)
    squared = (output - inputs.target)[0].square().mean(-1)
    expected = torch.stack([squared[(sample == i) & ~first].mean() for i in range(2)])
    torch.testing.assert_close(_loss(1.0).reduce(output, inputs).per_sample, expected)


def test_off_draws_what_it_drew_before() -> None:
    batch = _bucket()
    torch.manual_seed(1)
    before = DenoisingLoss(RectifiedFlow(sampling="uniform"), 0.0, PATCH, C, 8).draw(
        batch, torch.device("cpu")
    )
    torch.manual_seed(1)
    off = _loss(0.0).draw(batch, torch.device("cpu"))
    assert off.clean_first_frame is None and torch.equal(off.x, before.x)
    assert torch.equal(off.model_kwargs["noise_level"], before.model_kwargs["noise_level"])


def test_refused_where_it_cannot_run_when_the_profile_loads() -> None:
    """The layout rulebook refuses, at load, what the step cannot condition: the trainer, the planner and
    the dry run only ever see profiles that loaded."""
    wan = [
        "model.preset=wan2.2-ti2v-5b",
        "model.patch=[1,2,2]",
        "model.in_channels=48",
        "model.abs_position=none",
    ]
    wan += ["diffusion.objective=flow", "diffusion.image_condition=0.5"]
    assert load_profile(None, wan).diffusion.image_condition == 0.5
    two = ["cluster.cpu_processes=2"]
    for extra, says in [
        (["model.expand_timesteps=false"], "diffusion.image_condition: model.expand_timesteps is off"),
        (["diffusion.objective=edm"], "diffusion.image_condition: needs diffusion.objective=flow"),
        ([*two, "parallel.cp=2"], "parallel.cp: first-frame conditioning (diffusion.image_condition) trains"),
        ([*two, "parallel.pp=2"], "parallel.pp: first-frame conditioning (diffusion.image_condition) trains"),
        (
            [*two, "parallel.tp=2", "parallel.sequence_parallel=true"],
            "parallel.sequence_parallel: first-frame",
        ),
    ]:
        with pytest.raises(ProfileError) as refused:
            load_profile(None, [*wan, *extra])
        # the loader names the field by the --set that gave it (`--set parallel.cp=2: ...`)
        message, (field, words) = str(refused.value), says.split(": ", 1)
        assert field in message and words in message and "\n" not in message
        assert "diffusion.image_condition=0" in message  # the other fix
    # tensor parallel without sequence parallel conditions: the per-token levels are whole on every rank;
    # left unset, sequence parallel is off for it (the family's choice), on without first-frame conditioning
    assert load_profile(None, [*wan, *two, "parallel.tp=2", "parallel.sequence_parallel=false"])
    assert not sequence_parallel(load_profile(None, [*wan, *two, "parallel.tp=2"]))
    assert sequence_parallel(load_profile(None, [*wan, *two, "parallel.tp=2", "diffusion.image_condition=0"]))

"""What `vidforge infer` runs of a two-expert model (Wan2.2 A14B, `vidforge.sampling.experts`): one
process, every step (no step caching, whose fits are of one network's outputs)."""

from __future__ import annotations

from vidforge.errors import UserInputError
from vidforge.profile import RunProfile


def check_experts_run(profile: RunProfile, world: int, first_frame: bool = False) -> None:
    """Refuse, in one line, what a two-expert model does not sample with yet (`first_frame`: an image
    given as the first latent frame, model.expand_timesteps)."""
    if first_frame:
        raise UserInputError(
            "--image: a two-expert model samples from an image through its condition channels "
            "(model.condition_channels, Wan2.2 I2V-A14B), not through model.expand_timesteps; drop --image"
        )
    if world > 1:
        raise UserInputError(
            f"--nproc {world}: a two-expert model (model.experts=2) samples in one process; drop --nproc"
        )
    if profile.infer.cache.threshold > 0:
        raise UserInputError(
            "infer.cache.threshold: step caching is fitted to one network's outputs, not to two experts'; "
            "set infer.cache.threshold=0"
        )

"""The synthetic workload every bench command and the layout model share: per data-parallel rank, one
micro-batch of `samples` clips of equal token grid, each with `text_tokens` caption tokens."""

from __future__ import annotations

from dataclasses import dataclass

from vidforge.errors import UserInputError
from vidforge.models.flops import image_tokens
from vidforge.profile import RunProfile


@dataclass(frozen=True)
class Workload:
    samples: int
    """Clips per micro-batch per data-parallel rank (train.micro_batch)."""
    grid: tuple[int, int, int]
    """Token grid (t, h, w) of one clip after patchify."""
    text_tokens: int
    """Caption tokens per clip."""
    latent: tuple[int, int, int, int]
    """Latent shape (C, T, H, W) of one clip."""
    packed: bool = False
    """Samples packed into one row rather than a plain batch."""
    image_tokens: int = 0
    """Image-embedding tokens per clip (an image-to-video model with `model.image_dim`)."""
    token_levels: bool = False
    """A noise level per token rather than per sample (`model.expand_timesteps` trained with
    `diffusion.image_condition` > 0: the timestep embedding and the modulation are per token)."""

    @property
    def per_token_modulation(self) -> bool:
        """Whether the blocks hold a modulation per token: a noise level per token projects one, and a row
        that packs several samples gathers each token's (`Conditioning.per_token`); one sample's
        per-sample level broadcasts, packed or not."""
        return self.token_levels or (self.packed and self.samples > 1)

    @property
    def tokens_per_sample(self) -> int:
        t, h, w = self.grid
        return t * h * w

    @property
    def tokens(self) -> int:
        """Video tokens of the micro-batch (before any context-parallel split)."""
        return self.samples * self.tokens_per_sample

    def tokens_per_rank(self, cp: int, slicing: str = "chunks") -> float:
        """Video tokens one of `cp` context-parallel ranks holds: tokens / cp, or with the positions
        slicing (parallel.cp_impl=st-spatial) T x ceil(H W / cp) a clip, pad columns included."""
        if slicing != "positions" or cp == 1:
            return self.tokens / cp
        t, h, w = self.grid
        return self.samples * t * -(-(h * w) // cp)

    @classmethod
    def from_profile(
        cls, profile: RunProfile, samples: int | None = None, packed: bool | None = None
    ) -> Workload:
        """`bench.latent_*` clips, `train.micro_batch` of them per rank, packed into one row when
        `data.packing` is on (as the training loader does); the latent sizes must be multiples of
        model.patch."""
        b, model = profile.bench, profile.model
        pt, ph, pw = model.patch
        sizes = (("latent_frames", b.latent_frames, pt), ("latent_height", b.latent_height, ph))
        sizes += (("latent_width", b.latent_width, pw),)
        for name, size, patch in sizes:
            if size % patch:
                raise UserInputError(
                    f"bench.{name}: {size} is not a multiple of the model's patch size {patch} "
                    f"(model.patch={list(model.patch)}); use {patch * max(1, size // patch)}"
                )
        grid = (b.latent_frames // pt, b.latent_height // ph, b.latent_width // pw)
        latent = (model.in_channels, b.latent_frames, b.latent_height, b.latent_width)
        packed = profile.data.packing if packed is None else packed
        # any diffusion.image_condition draws per-token levels for every batch (`DenoisingLoss.draw`)
        levels = model.expand_timesteps and profile.diffusion.image_condition > 0
        samples = samples or profile.train.micro_batch
        return cls(samples, grid, b.text_tokens, latent, packed, image_tokens(model), levels)

    def describe(self) -> str:
        t, h, w = self.grid
        return (
            f"{self.samples} x {t}x{h}x{w} = {self.tokens:,} video tokens "
            f"(+ {self.text_tokens} caption{f' and {self.image_tokens} image' if self.image_tokens else ''} "
            f"tokens a clip){', packed in one row' if self.packed else ''}"
        )

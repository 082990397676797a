"""Step caching (`infer.cache`): skip the block stack at sampling steps whose input barely moved, and
reuse the last computed step's residual. The rule is TeaCache's (Liu et al. 2024, "Timestep Embedding
Tells: It's Time to Cache for Video Diffusion Model"):

- at every model call, an indicator is read before the blocks run: the first block's modulated input
  (adaLN's norm(h) * (1 + scale) + shift), or, for Wan2.1 with TeaCache's published fit, the timestep
  embedding (what TeaCache4Wan2.1 fitted its polynomials on);
- its relative L1 change from the previous call, mean|now - before| / mean|before|, goes through a
  polynomial rescaling (fitted per model family so that it tracks the change of the blocks' output;
  the identity where none is published, e.g. our DiT) and is added to an accumulator;
- while the accumulator stays below `infer.cache.threshold` the call is skipped: the output is the input
  plus the residual (output minus input of the block stack) of the last computed call; otherwise the
  blocks run, the residual is kept, and the accumulator restarts at 0. The first call always runs.

Under classifier-free guidance the conditional and unconditional rows run in one network call, so they
decide together (one decision for the call, on the change of all its rows) and each row reuses its own
residual: the two branches see the same latents and noise level (they differ by the caption, which the
modulation sees only through model.text_pool), and deciding apart would split the batched call in two.
Every prompt of a batch shares the decision too, so with caching on a video depends on which prompts
share its batch (infer.batch_size), which without it it does not.

The model side is one hook: `VideoTransformer.forward` hands its block stack to `model.step_cache` when
one is installed (`installed`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from vidforge.errors import UserInputError
from vidforge.families import family
from vidforge.models.backbone import VideoTransformer
from vidforge.models.layers import Conditioning, modulate
from vidforge.profile.model import Model

# TeaCache's polynomials, highest degree first (numpy.poly1d's order), from TeaCache4Wan2.1/
# teacache_generate.py in github.com/ali-vilab/TeaCache (the mode without "retention steps", whose
# indicator is the timestep embedding `e`, Wan's temb): fitted on T2V-1.3B and T2V-14B at 480p/720p.
WAN21_COEFFICIENTS: dict[str, tuple[float, ...]] = {
    "wan2.1-t2v-1.3b": (2.39676752e03, -1.31110545e03, 2.01331979e02, -8.29855975e00, 1.37887774e-01),
    "wan2.1-t2v-14b": (-5784.54975374, 5449.50911966, -1811.16591783, 256.27178429, -13.02252404),
}


def rescale_name(setting: str, config: Model) -> str:
    """The polynomial `infer.cache.rescale` names for a model of `config`: `auto` is the fit the
    model's family lists for its size (`FamilySpec.step_cache_fits`: Wan2.1's published sizes) and
    `identity` otherwise; a fit of another family is refused in one line."""
    fits = family(config.family).step_cache_fits
    if setting == "auto":
        return fits.get((config.hidden, config.layers), "identity")
    if setting != "identity" and setting not in fits.values():
        raise UserInputError(
            f"infer.cache.rescale: {setting} was fitted on Wan2.1's timestep embedding, but the model is "
            f"model.family={config.family}; set infer.cache.rescale=identity (or auto)"
        )
    return setting


class StepCache:
    """TeaCache's rule over one model (see the module docstring). `calls` and `skipped` count the model
    calls seen and skipped since construction (over every batch it sampled); `reset` forgets the
    previous call, as a new batch must."""

    def __init__(self, threshold: float, rescale: str = "identity") -> None:
        if threshold < 0:
            raise UserInputError(f"infer.cache.threshold: must be >= 0 (0: off), got {threshold}")
        self.threshold = threshold
        self.rescale = rescale
        self.coefficients = WAN21_COEFFICIENTS.get(rescale, ())
        self.calls = 0
        self.skipped = 0
        self.reset()

    def reset(self) -> None:
        self.previous: torch.Tensor | None = None
        self.residual: torch.Tensor | None = None
        self.accumulated = 0.0

    def indicator(self, model: VideoTransformer, h: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """What the change is measured on: the timestep embedding for a Wan fit, else the first block's
        modulated input."""
        if self.coefficients:
            return cond.time.float()
        block = next(iter(model.blocks.values()))
        if hasattr(block, "modulation"):  # the DiT, ST-DiT and multimodal blocks: adaLN chunks 0, 1
            params = block.modulation(cond)
            return modulate(block.norm1(h), params[0], params[1]).float()
        # WanBlock: its table plus time_proj, chunks 0 (shift) and 1 (scale), as its forward reads them
        table = block.scale_shift_table.flatten(1) + cond.shared_modulation.float()
        shift, scale = cond.per_token(table).chunk(block.scale_shift_table.shape[1], dim=-1)[:2]
        return block.norm1(h.float()) * (1 + scale) + shift

    def change(self, now: torch.Tensor, before: torch.Tensor) -> float:
        """Relative L1 change, rescaled by the polynomial (Horner's rule)."""
        x = ((now - before).abs().mean() / before.abs().mean().clamp_min(1e-12)).item()
        if not self.coefficients:
            return x
        value = 0.0
        for c in self.coefficients:
            value = value * x + c
        return value

    def __call__(
        self,
        model: VideoTransformer,
        h: torch.Tensor,
        cond: Conditioning,
        blocks: Callable[[torch.Tensor, Conditioning], torch.Tensor],
    ) -> torch.Tensor:
        self.calls += 1
        if self.threshold == 0:  # off: nothing measured, every call computed
            return blocks(h, cond)
        now = self.indicator(model, h, cond)
        skip = False
        if self.previous is not None and self.previous.shape == now.shape and self.residual is not None:
            self.accumulated += self.change(now, self.previous)
            skip = self.accumulated < self.threshold and self.residual.shape == h.shape
        self.previous = now
        if skip:
            self.skipped += 1
            return h + self.residual.to(h.dtype)
        self.accumulated = 0.0
        out = blocks(h, cond)
        self.residual = out - h
        return out


@contextmanager
def installed(model: VideoTransformer, cache: StepCache | None) -> Iterator[None]:
    """`model` samples through `cache` inside the `with` (from a fresh start: `cache.reset()`); None: as it is."""
    if cache is None:
        yield
        return
    cache.reset()
    model.step_cache = cache
    try:
        yield
    finally:
        model.step_cache = None
        cache.reset()  # the residual is activation-sized: not kept past the batch

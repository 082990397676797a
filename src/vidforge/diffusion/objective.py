"""What a diffusion training objective is, as weightless math that the training step and the samplers
ask (diffusers' schedulers are the example: configuration and formulas, no weights, no process groups).

Everything is written in terms of the raw network F, so that one loss serves every objective and every
layout (plain batch, packed row, context-parallel shard, the last pipeline stage):

    noisy   = corrupt(clean, noise, level)            the training input at noise level `level`
    F(network_input(noisy, level), network_level(level), ...)
    loss    = mean (error_scale(level) (F - target(clean, noise, level)))^2
    clean estimate for sampling = denoised(noisy, F, level)

`level` is the objective's own noise coordinate (EDM: sigma; rectified flow: t in [0, 1]), one value per
sample, drawn by `sample_levels`. Arguments named `*_b` broadcast against the tensors: (B, 1, ...) for a
plain batch, per token (1, S, 1) for a packed row. An objective whose loss carries a weight folds it into
`target` and `network_input` where it can (EDM's lambda c_out^2 = 1 makes its weighted loss a plain squared
error on F), else says it in `error_scale`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

RawNetwork = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""F(network input, network level) -> raw output, with the level per sample (N,) (closing over text and
layout)."""

Denoiser = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""D(x, level) -> estimate of the clean sample, same shape as x; level a 0-d tensor: what every sampler
takes (`Objective.denoise` for a batch at one level)."""


class Objective(ABC):
    """A training objective and its parameterisation of the network (see the module docstring)."""

    level_name: str = "level"
    """What the noise coordinate is called in metrics (`loss_<level_name>_<lo>-<hi>`)."""
    level_bucket_edges: tuple[float, ...] = ()
    """Edges of the per-noise-level loss buckets in metrics.jsonl."""

    def at_tokens(self, tokens: int) -> Objective:
        """The objective for samples of `tokens` tokens (a flow shift that follows the size); itself by
        default."""
        return self

    @abstractmethod
    def sample_levels(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Training noise levels (n,), float32 on the CPU (from `generator`, else torch's global one)."""

    @abstractmethod
    def corrupt(self, clean: torch.Tensor, noise: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        """The noisy sample at `level_b` from clean data and standard normal noise."""

    @abstractmethod
    def implied_noise(self, noisy: torch.Tensor, clean: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        """The noise that `corrupt` mixes with `clean` at `level_b` to give `noisy` (levels above 0): a
        clean estimate's own noise, which a deterministic (DDIM-like) step carries to the next level."""

    @abstractmethod
    def network_input(self, noisy: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        """What the network is fed for the noisy sample."""

    @abstractmethod
    def network_level(self, level: torch.Tensor) -> torch.Tensor:
        """The network's noise-level input for per-sample levels (N,)."""

    @abstractmethod
    def target(self, clean: torch.Tensor, noise: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        """The raw network output that makes the loss zero."""

    def error_scale(self, level_b: torch.Tensor) -> torch.Tensor | None:
        """The factor on F - target in the loss, broadcast like `level_b`; None: 1."""
        return None

    @abstractmethod
    def denoised(self, noisy: torch.Tensor, raw: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        """The clean-sample estimate from the network's raw output `raw` at the noisy sample."""

    def denoise(
        self, network: RawNetwork, x: torch.Tensor, level: torch.Tensor, level_b: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The clean-sample estimate at the noisy sample x, levels (B,) per sample (`level_b` overrides
        their broadcast shape, e.g. per token for a packed row): what the samplers call."""
        level_b = self.expand(level, x) if level_b is None else level_b
        raw = network(self.network_input(x, level_b), self.network_level(level))
        return self.denoised(x, raw, level_b)

    @staticmethod
    def expand(level: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Per-sample levels (B,) -> (B, 1, ..., 1), broadcastable against a batch `like` (B, ...)."""
        return level.reshape(level.shape[0], *([1] * (like.ndim - 1)))

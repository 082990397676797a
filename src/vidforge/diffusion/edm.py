"""EDM (Karras et al. 2022, "Elucidating the Design Space of Diffusion-Based Generative Models").

The denoiser is D(x; sigma) = c_skip(sigma) x + c_out(sigma) F(c_in(sigma) x; c_noise(sigma)) for a
raw network F, with (Table 1, "ours"):

    c_skip = sd^2 / (sigma^2 + sd^2)          c_out = sigma sd / sqrt(sigma^2 + sd^2)
    c_in   = 1 / sqrt(sigma^2 + sd^2)         c_noise = ln(sigma) / 4
    loss weight lambda = (sigma^2 + sd^2) / (sigma sd)^2,    ln(sigma) ~ N(P_mean, P_std^2) in training

so that F's input and training target both have unit variance and lambda c_out^2 = 1. `EDM` is pure
math: it holds the four numbers above and no model. Sigma arguments broadcast against x: a plain batch
passes `edm.expand(sigma, x)` ((B,) -> (B, 1, 1, 1, 1)), a packed row `layout.per_token(sigma)[..., None]`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vidforge.profile.diffusion import Diffusion

RawNetwork = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""F(c_in * x, c_noise) -> raw output, with c_noise per sample (N,) (closing over text and layout)."""


@dataclass(frozen=True)
class EDM:
    sigma_data: float = 0.5
    p_mean: float = -1.2
    p_std: float = 1.2

    def __post_init__(self) -> None:
        if self.sigma_data <= 0 or self.p_std <= 0:
            raise ValueError(
                f"diffusion.sigma_data and diffusion.p_std must be > 0, got {self.sigma_data}, {self.p_std}"
            )

    @classmethod
    def from_profile(cls, diffusion: Diffusion) -> EDM:
        return cls(sigma_data=diffusion.sigma_data, p_mean=diffusion.p_mean, p_std=diffusion.p_std)

    # --- preconditioning ---------------------------------------------------------------------------

    def c_skip(self, sigma: torch.Tensor) -> torch.Tensor:
        return self.sigma_data**2 / (sigma**2 + self.sigma_data**2)

    def c_out(self, sigma: torch.Tensor) -> torch.Tensor:
        return sigma * self.sigma_data / (sigma**2 + self.sigma_data**2).sqrt()

    def c_in(self, sigma: torch.Tensor) -> torch.Tensor:
        return 1 / (sigma**2 + self.sigma_data**2).sqrt()

    def c_noise(self, sigma: torch.Tensor) -> torch.Tensor:
        return sigma.log() / 4

    def loss_weight(self, sigma: torch.Tensor) -> torch.Tensor:
        return (sigma**2 + self.sigma_data**2) / (sigma * self.sigma_data) ** 2

    @staticmethod
    def expand(sigma: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Per-sample sigma (B,) -> (B, 1, ..., 1), broadcastable against a batch `like` (B, ...)."""
        return sigma.reshape(sigma.shape[0], *([1] * (like.ndim - 1)))

    def denoise(
        self, network: RawNetwork, x: torch.Tensor, sigma: torch.Tensor, sigma_b: torch.Tensor | None = None
    ) -> torch.Tensor:
        """D(x; sigma) for a plain batch: sigma (B,) per sample (`sigma_b` overrides the broadcast
        shape, e.g. per token for a packed row). `network(c_in x, c_noise)` is the raw model."""
        sigma_b = self.expand(sigma, x) if sigma_b is None else sigma_b
        raw = network(self.c_in(sigma_b) * x, self.c_noise(sigma))
        return self.c_skip(sigma_b) * x + self.c_out(sigma_b) * raw.to(x.dtype)

    # --- training ----------------------------------------------------------------------------------

    def sample_sigma(
        self,
        n: int,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """Training noise levels: ln(sigma) ~ N(P_mean, P_std^2), shape (n,)."""
        normal = torch.randn(n, generator=generator, device=device, dtype=dtype)
        return (self.p_mean + self.p_std * normal).exp()

    def loss(self, denoised: torch.Tensor, clean: torch.Tensor, sigma_b: torch.Tensor) -> torch.Tensor:
        """Per-element weighted loss lambda(sigma) (D - x0)^2 (reduce it as the trainer likes; its mean
        is about 1 for an untrained network whose output is zero)."""
        return self.loss_weight(sigma_b) * (denoised - clean) ** 2

    def training_loss(
        self,
        network: RawNetwork,
        clean: torch.Tensor,
        sigma: torch.Tensor,
        noise: torch.Tensor,
        sigma_b: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Mean EDM loss of a batch: noise the clean latents by sigma (per sample), denoise, weight."""
        sigma_b = self.expand(sigma, clean) if sigma_b is None else sigma_b
        denoised = self.denoise(network, clean + sigma_b * noise, sigma, sigma_b)
        return self.loss(denoised, clean, sigma_b).mean()

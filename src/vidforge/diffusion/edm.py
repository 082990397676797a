"""EDM (Karras et al. 2022, "Elucidating the Design Space of Diffusion-Based Generative Models").

The denoiser is D(x; sigma) = c_skip(sigma) x + c_out(sigma) F(c_in(sigma) x; c_noise(sigma)) for a
raw network F, with (Table 1, "ours"):

    c_skip = sd^2 / (sigma^2 + sd^2)          c_out = sigma sd / sqrt(sigma^2 + sd^2)
    c_in   = 1 / sqrt(sigma^2 + sd^2)         c_noise = ln(sigma) / 4
    loss weight lambda = (sigma^2 + sd^2) / (sigma sd)^2,    ln(sigma) ~ N(P_mean, P_std^2) in training

so that F's input and training target both have unit variance and lambda c_out^2 = 1. `EDM` is pure
math: it holds the four numbers above and no model. Sigma arguments broadcast against x: a plain batch
passes `edm.expand(sigma, x)` ((B,) -> (B, 1, 1, 1, 1)), a packed row `layout.per_token(sigma)[..., None]`.

As an `Objective` (vidforge.diffusion.objective) the level is sigma, the network input c_in x, its noise
level c_noise, and since lambda c_out^2 = 1,

    lambda (D - y)^2 = (F - (y - c_skip x) / c_out)^2,   (y - c_skip x) / c_out = (y sigma / sd - n sd) / s

with x = y + sigma n and s = sqrt(sigma^2 + sd^2): the weighted loss is a plain squared error on F against
that target, written in closed form (no cancellation at small sigma).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vidforge.diffusion.objective import Objective


@dataclass(frozen=True)
class EDM(Objective):
    level_name = "sigma"
    # log-spaced from low noise (detail) to high noise (layout)
    level_bucket_edges = (0.1, 0.5, 1.0, 2.0, 5.0)

    sigma_data: float = 0.5
    p_mean: float = -1.2
    p_std: float = 1.2

    def __post_init__(self) -> None:
        if self.sigma_data <= 0 or self.p_std <= 0:
            raise ValueError(f"EDM's sigma_data and p_std must be > 0, got {self.sigma_data}, {self.p_std}")

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

    # --- training (the Objective interface) --------------------------------------------------------

    def sample_levels(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Training noise levels: ln(sigma) ~ N(P_mean, P_std^2), shape (n,)."""
        normal = torch.randn(n, generator=generator)
        return (self.p_mean + self.p_std * normal).exp()

    def corrupt(self, clean: torch.Tensor, noise: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        return clean + level_b * noise

    def implied_noise(self, noisy: torch.Tensor, clean: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        return (noisy - clean) / level_b

    def network_input(self, noisy: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        return self.c_in(level_b) * noisy

    def network_level(self, level: torch.Tensor) -> torch.Tensor:
        return self.c_noise(level)

    def target(self, clean: torch.Tensor, noise: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        sd = self.sigma_data
        s = (level_b**2 + sd**2).sqrt()
        return (clean * (level_b / sd) - noise * sd) / s

    def denoised(self, noisy: torch.Tensor, raw: torch.Tensor, level_b: torch.Tensor) -> torch.Tensor:
        return self.c_skip(level_b) * noisy + self.c_out(level_b) * raw.to(noisy.dtype)

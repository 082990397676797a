"""A tiny DiT trained with the EDM loss memorises one latent clip on CPU: loss falls 10x."""

import pytest
import torch

from vidforge.diffusion import EDM
from vidforge.models import build_model, model_config


@pytest.fixture
def one_thread():
    """The tiny model's matmuls gain nothing from a second thread, and on a shared 2-core machine two
    threads contending with other processes run several times slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0])
def test_tiny_dit_overfits_one_clip(seed, one_thread):
    torch.manual_seed(seed)
    model = build_model(model_config("tiny"))
    edm = EDM()
    clip = 0.5 * torch.randn(1, 4, 2, 8, 8)  # one latent clip with sigma_data's scale
    text = torch.randn(1, 3, 32)
    g = torch.Generator().manual_seed(seed + 1)
    batch, steps = 16, 400

    def loss_of(sigma, noise):  # the objective's loss: mean (F - target)^2
        clean = clip.expand(sigma.shape[0], -1, -1, -1, -1)
        sb = edm.expand(sigma, clean)
        x_in = edm.network_input(edm.corrupt(clean, noise, sb), sb)
        raw = model(x_in, edm.network_level(sigma), text.expand(sigma.shape[0], -1, -1))
        return (raw - edm.target(clean, noise, sb)).square().mean()

    # A fixed evaluation set of noise levels (from the training distribution) and noises.
    eval_sigma = edm.sample_levels(64, generator=g)
    eval_noise = torch.randn(64, *clip.shape[1:], generator=g)

    def eval_loss():
        with torch.no_grad():
            return loss_of(eval_sigma, eval_noise).item()

    before = eval_loss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps, eta_min=1e-4)
    for _ in range(steps):
        sigma = edm.sample_levels(batch, generator=g)
        noise = torch.randn(batch, *clip.shape[1:], generator=g)
        loss = loss_of(sigma, noise)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    after = eval_loss()
    assert before > 0.5  # an untrained (zero-output) network has loss about 1
    assert after < before / 10, f"loss fell only from {before:.3f} to {after:.3f}"

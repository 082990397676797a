"""The tokenizer fine-tune's losses and measures: pixel reconstruction (MSE/L1), KL of the posterior,
LPIPS (the `lpips` package, its backbone from a local file), the hinge GAN losses, PSNR and SSIM.

Videos are (B, 3, F, H, W) in [-1, 1]; image measures run on every frame."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vidforge.errors import UserInputError


def frames(video: torch.Tensor) -> torch.Tensor:
    """(B, 3, F, H, W) -> (B*F, 3, H, W)."""
    return video.transpose(1, 2).flatten(0, 1)


def recon_loss(kind: str, recon: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(recon, target) if kind == "mse" else F.l1_loss(recon, target)


def kl_loss(mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, exp(logvar)) || N(0, 1)), mean over latent elements."""
    return 0.5 * (mean.pow(2) + logvar.exp() - 1.0 - logvar).mean()


def hinge_d_loss(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    return 0.5 * (F.relu(1.0 - real_logits).mean() + F.relu(1.0 + fake_logits).mean())


def hinge_g_loss(fake_logits: torch.Tensor) -> torch.Tensor:
    return -fake_logits.mean()


def psnr(recon: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per video, in dB, on [0, 1] pixels (recon clamped to the valid range)."""
    mse = ((recon.clamp(-1, 1) - target) / 2).pow(2).flatten(1).mean(1)
    return 10 * torch.log10(1.0 / mse.clamp_min(1e-10))


def _gaussian(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    return g / g.sum()


def ssim(recon: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per video: the mean SSIM of its frames and channels (Wang et al. 2004: an 11-tap Gaussian window of
    sigma 1.5, K1 0.01, K2 0.03, on [0, 1] pixels, valid positions only)."""
    x = frames((recon.clamp(-1, 1) + 1) / 2).double()
    y = frames((target + 1) / 2).double()
    n, c = x.shape[:2]
    g = _gaussian().to(x.device)
    win = (g[:, None] * g[None, :]).expand(c, 1, -1, -1).contiguous()

    def blur(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, win, groups=c)

    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    c1, c2 = 0.01**2, 0.03**2
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    per_frame = s.flatten(1).mean(1)
    return per_frame.view(recon.shape[0], -1).mean(1).float()


def build_lpips(net: str, backbone: str | None) -> torch.nn.Module:
    """LPIPS with its linear heads from the package and the backbone from `backbone` (a torchvision state
    dict: `features.N.*` are LPIPS's `sliceK.N.*`), random when None. Frozen, in eval mode."""
    import warnings

    import lpips

    # torchvision's deprecation of `pretrained=`, which lpips passes, silenced; a random backbone is the
    # same one on every rank and in every run.
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore", UserWarning)
        torch.manual_seed(0)
        model = lpips.LPIPS(pretrained=True, net=net, pnet_rand=True, verbose=False)
    if backbone is not None:
        try:
            state = torch.load(backbone, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError) as err:
            raise UserInputError(
                f"tokenizer.finetune.lpips_backbone: cannot read {backbone}: {err}"
            ) from None
        own = model.net.state_dict()
        mapped = {k: state.get("features." + k.split(".", 1)[1]) for k in own}
        missing = [k for k, v in mapped.items() if v is None]
        if missing:
            raise UserInputError(
                f"tokenizer.finetune.lpips_backbone: {backbone} is not a torchvision {net} state dict "
                f"(no features.{missing[0].split('.', 1)[1]}); point at that network's weights"
            )
        model.net.load_state_dict(mapped)
    return model.eval().requires_grad_(False)


def lpips_distance(model: torch.nn.Module, recon: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per video: the mean LPIPS of its frames."""
    d = model(frames(recon).float(), frames(target).float(), normalize=False)
    return d.flatten(1).mean(1).view(recon.shape[0], -1).mean(1)

"""How well a trained model denoises its own training latents: the RMS error of its one-step clean
estimate at several noise levels, conditional and unconditional, beside the noise's own size. A model
that only passes its input through scores the noise's size (t for flow: x_t - x0 = t (noise - x0) ~ t);
one that has learnt the data scores well below it; a caption the model ignores leaves conditional and
unconditional equal. docs/benchmarks.md (Demo sweep) has what it showed for the demo.

    python bench/denoise_error.py RUN_DIR LATENTS/train-000000.tar [--samples 12]
"""

from __future__ import annotations

import argparse

import torch

from vidforge.data.shard_reader import iter_shard
from vidforge.diffusion import build_objective
from vidforge.infer.weights import checkpoint_profile, find_export
from vidforge.sampling.latents import batched_denoiser
from vidforge.weights.checkpoint import load_model

LEVELS = (0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98)


def _read(shard: str, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first `count` samples (by key) of a latent shard: latents, caption embeddings and masks."""
    samples = sorted(iter_shard(shard), key=lambda s: s["__key__"])[:count]

    def stack(ext: str) -> torch.Tensor:
        return torch.stack([torch.from_numpy(s[ext]) for s in samples])

    return stack("latent.npy").float(), stack("text_emb.npy").float(), stack("text_mask.npy")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a `vidforge train` run directory (or its export/)")
    ap.add_argument("shard", help="a latent shard (.tar) of its training data")
    ap.add_argument("--samples", type=int, default=12, help="samples to score")
    args = ap.parse_args(argv)

    export = find_export(args.run)
    profile = checkpoint_profile(export, [])
    model = load_model(export, device="cpu").eval()
    latents, text, mask = _read(args.shard, args.samples)
    n = latents.shape[0]
    denoise = batched_denoiser(model, profile, text, mask)
    objective = build_objective(profile.diffusion)
    print(f"{n} samples, latents mean {latents.mean():+.3f} std {latents.std():.3f}")
    print(f"{objective.level_name:>6} {'noise':>7} {'cond':>7} {'uncond':>7}")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for level in LEVELS:
            noise = torch.randn(latents.shape, generator=generator)
            level_b = objective.expand(torch.full((n,), level), latents)
            noisy = objective.corrupt(latents, noise, level_b)
            errors = []
            for uncond in (False, True):
                estimate = denoise(noisy, torch.tensor(level), torch.full((n,), uncond))
                errors.append((estimate - latents).pow(2).mean().sqrt().item())
            size = (noisy - latents).pow(2).mean().sqrt().item()
            print(f"{level:>6.2f} {size:>7.3f} {errors[0]:>7.3f} {errors[1]:>7.3f}")


if __name__ == "__main__":
    main()

"""`vidforge tokenize finetune`: fine-tune a diffusers Wan VAE (optionally grown) on clips or media shards.

One step: every rank encodes `batch` clips, samples the posterior, decodes, and takes the loss of
`tokenizer.finetune` (recon + KL + LPIPS, + GAN once the discriminator has started), then the
discriminator its hinge loss on the same clips. Under torchrun the VAE and the discriminator are
sharded with FSDP2 over all ranks (data parallel: rank r takes the r-th `batch` of each step's clips).
On a GPU that has bf16 the forward runs under bf16 autocast; parameters and optimizer stay fp32.

Clips are decoded once (the first `frames`, resized and centre-cropped to `size`) and held in memory:
a fine-tune set, not a pre-training corpus. The first `holdout` clips (in name order) are held out for
PSNR, SSIM and LPIPS. Each step's clips come from a permutation seeded by (seed, epoch), so a resumed
run draws what an unbroken one draws, and each clip's posterior noise comes from (seed, step, clip).

RUN/ holds checkpoints/ (DCP, as `train` writes them), metrics.jsonl, grids/step_N.png (the held-out
clip's frames: originals above reconstructions) and vae/, the result as a diffusers folder
(`--set tokenizer.path=RUN/vae` for `vidforge tokenize`)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from vidforge.data.buckets import resize_crop
from vidforge.data.media import MediaError, media_kind, read_media
from vidforge.errors import UserInputError
from vidforge.files import write_text
from vidforge.parallel.dims import ParallelDims
from vidforge.parallel.fsdp import apply_fsdp
from vidforge.parallel.runtime import Runtime
from vidforge.profile import RunProfile
from vidforge.profile.data import VIDEO_EXTENSIONS
from vidforge.tokenizers import losses
from vidforge.tokenizers.discriminator import PatchDiscriminator3D
from vidforge.tokenizers.interface import frames_to_tensor, tensor_to_frames
from vidforge.tokenizers.vae import vae_class
from vidforge.train.checkpoint import CheckpointManager
from vidforge.train.metrics import MetricsLog
from vidforge.train.tokenizer_grow import grown_config, init_partial


class Autoencoder(nn.Module):
    """The VAE's encode, posterior sample and decode as one `forward`, so FSDP2's hooks (which run on
    `forward`) gather its parameters once per step."""

    def __init__(self, vae: nn.Module):
        super().__init__()
        self.vae = vae

    def forward(self, video: torch.Tensor, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """Reconstruction, posterior mean and log-variance; decodes mean + std x noise (the mode without)."""
        posterior = self.vae.encode(video).latent_dist
        z = posterior.mean if noise is None else posterior.mean + posterior.std * noise
        return self.vae.decode(z).sample, posterior.mean, posterior.logvar


# ---- data ----------------------------------------------------------------------------------------------


def _fit(frames: np.ndarray, n: int, size: list[int], name: str) -> torch.Tensor:
    if len(frames) < n:
        raise UserInputError(
            f"{name}: {len(frames)} frames, fewer than tokenizer.finetune.frames={n}; lower it or drop the clip"
        )
    return frames_to_tensor(resize_crop(frames[:n], size[0], size[1]))


def load_clips(src: str | os.PathLike, n: int, size: list[int]) -> list[tuple[str, torch.Tensor]]:
    """(name, (3, n, H, W) video) of every clip of a clips folder (manifest.jsonl with `media`) or a media
    shard folder (index.json of `vidforge shard`), in name order."""
    src = Path(src)
    out: list[tuple[str, torch.Tensor]] = []
    if (src / "index.json").is_file():
        from vidforge.data.shard_index import read_index
        from vidforge.data.shard_reader import check_shard, read_members

        index = read_index(src)
        if index.kind != "media":
            raise UserInputError(
                f"{src}: holds {index.kind} shards; pass the output folder of `vidforge shard`"
            )
        for entry in sorted(index.shards, key=lambda e: e.name):
            path = index.path(entry)
            for sample in check_shard(path, entry, "sha256"):
                members = read_members(path, sample)
                media = [e for e in members if e in VIDEO_EXTENSIONS]
                if media:
                    out.append(
                        (sample.key, _fit(read_media(members[media[0]], "video", n), n, size, sample.key))
                    )
    elif (src / "manifest.jsonl").is_file():
        from vidforge.data.manifest import read_jsonl
        from vidforge.data.paths import inside

        for record in read_jsonl(src / "manifest.jsonl"):
            if not record.get("media") or media_kind(record["media"]) != "video":
                continue
            path = inside(src, record["media"], "media path")
            try:
                frames = read_media(path, "video", n)
            except MediaError as err:
                raise UserInputError(f"{path}: {err}") from None
            out.append((path.stem, _fit(frames, n, size, str(path))))
    else:
        raise UserInputError(
            f"{src}: neither a clips folder (manifest.jsonl) nor media shards (index.json); pass the output "
            "of `vidforge clip`, `caption` or `shard`"
        )
    return sorted(out, key=lambda c: c[0])


def posterior_noise(shape: tuple[int, ...], seed: int, step: int, clip: int) -> torch.Tensor:
    """The posterior sample's noise for one clip at one step: from (seed, step, clip) alone, so any split
    of a step's clips over ranks, and a resumed run, draw the same noise."""
    g = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1_000_003 + clip) % 2**63)
    return torch.randn(shape, generator=g)


def step_indices(step: int, count: int, per_step: int, seed: int) -> list[int]:
    """The training clips of `step` (0-based): consecutive slices of per-epoch permutations."""
    out = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, pos = divmod(k, count)
        perm = torch.randperm(count, generator=torch.Generator().manual_seed(seed * 100003 + epoch))
        out.append(int(perm[pos]))
    return out


# ---- model ---------------------------------------------------------------------------------------------


def build_vae(profile: RunProfile) -> tuple[nn.Module, dict[str, Any]]:
    """The pretrained VAE at tokenizer.path, grown as tokenizer.finetune says; returns it and the init
    report (`loaded`, `new`, `reshaped`, `unused` tensor counts)."""
    tok, ft = profile.tokenizer, profile.tokenizer.finetune
    if tok.kind != "wan":
        raise UserInputError(
            f"tokenizer.kind: finetune handles the wan VAE, got {tok.kind}; set tokenizer.kind=wan"
        )
    if tok.path is None or not Path(tok.path, "config.json").is_file():
        raise UserInputError(
            f"tokenizer.path: finetune starts from a diffusers VAE folder (with config.json), got {tok.path}"
        )
    cls = vae_class(tok.kind)
    vae = cls.from_pretrained(tok.path, torch_dtype=torch.float32)
    if not ft.extra_spatial_levels:
        n = len(vae.state_dict())
        return vae, {
            "loaded": n,
            "new": 0,
            "reshaped": 0,
            "unused": 0,
            "describe": f"{tok.path}: {n} tensors",
        }
    config = grown_config(vae.config, ft.extra_spatial_levels)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ft.seed)
        grown = cls.from_config(config)
    report = init_partial(grown, vae.state_dict(), ft.extra_spatial_levels, tok.path)
    return grown, {**report.as_dict(), "describe": report.describe()}


def vae_latent_shape(vae: nn.Module, frames: int, size: list[int]) -> tuple[int, int, int]:
    ct, cs = int(vae.config.scale_factor_temporal), int(vae.config.scale_factor_spatial)
    return 1 + (frames - 1) // ct, size[0] // cs, size[1] // cs


def _check_shapes(vae: nn.Module, profile: RunProfile) -> None:
    ft = profile.tokenizer.finetune
    ct, cs = int(vae.config.scale_factor_temporal), int(vae.config.scale_factor_spatial)
    if (ft.frames - 1) % ct or ft.size[0] % cs or ft.size[1] % cs:
        raise UserInputError(
            f"tokenizer.finetune.frames/size: {ft.frames} frames of {ft.size[0]}x{ft.size[1]} do not fit a VAE "
            f"compressing ({ct}, {cs}): frames must be {ct}k+1 and sizes multiples of {cs}"
        )


def _shard(modules: list[nn.Module], runtime: Runtime) -> None:
    """FSDP2 over every rank (pure data parallel: the profile's layout is the DiT's), each module its own
    root, parameters and gradients in fp32."""
    if runtime.world <= 1:
        return
    dims = ParallelDims.data_parallel(runtime.world, runtime.device.type)
    for module in modules:
        apply_fsdp(module, dims.fsdp_mesh(), nn.ModuleList(), param_dtype=torch.float32)


def _autocast(device: torch.device) -> contextlib.AbstractContextManager:
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def _init_state(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter its AdamW state with a zero-learning-rate step on zero gradients (as DCP's
    state-dict helpers do for an empty optimizer). Otherwise parameters that have had no gradient yet
    (the discriminator before gan_start; time convolutions a 1-frame clip never reaches) have no state in
    a checkpoint, and the fresh optimizer of a resumed run, which DCP gives state for all, cannot load it."""
    lrs = [g["lr"] for g in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr


def _full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


# ---- the run -------------------------------------------------------------------------------------------


@dataclass
class Parts:
    ae: Autoencoder
    disc: PatchDiscriminator3D
    opt_g: torch.optim.Optimizer
    opt_d: torch.optim.Optimizer
    lpips: nn.Module


def train_step(
    parts: Parts,
    video: torch.Tensor,
    noise: torch.Tensor,
    step: int,
    profile: RunProfile,
    device: torch.device,
) -> dict:
    """One optimizer step of the VAE (and of the discriminator once started); returns its losses, each the
    mean over every rank's clips."""
    ft = profile.tokenizer.finetune
    gan = ft.gan_weight > 0 and step >= ft.gan_start
    for group in parts.opt_g.param_groups:
        group["lr"] = ft.lr * min(1.0, (step + 1) / ft.warmup_steps) if ft.warmup_steps else ft.lr
    with _autocast(device):
        recon, mean, logvar = parts.ae(video, noise)
    recon = recon.float()
    out = {
        "loss_recon": losses.recon_loss(ft.recon, recon, video),
        "loss_kl": losses.kl_loss(mean.float(), logvar.float()),
    }
    total = ft.recon_weight * out["loss_recon"] + ft.kl_weight * out["loss_kl"]
    if ft.lpips_weight > 0:
        out["loss_lpips"] = losses.lpips_distance(parts.lpips, recon, video).mean()
        total = total + ft.lpips_weight * out["loss_lpips"]
    if gan:
        with _autocast(device):
            out["loss_gan"] = losses.hinge_g_loss(parts.disc(recon).float())
        total = total + ft.gan_weight * out["loss_gan"]
    parts.opt_g.zero_grad(set_to_none=True)
    total.backward()
    parts.opt_g.step()
    if gan:
        with _autocast(device):
            d = losses.hinge_d_loss(parts.disc(video).float(), parts.disc(recon.detach()).float())
        parts.opt_d.zero_grad(set_to_none=True)
        d.backward()
        parts.opt_d.step()
        out["loss_disc"] = d
    out["loss"] = total
    return {k: _mean_over_ranks(v.detach()) for k, v in out.items()}


def _mean_over_ranks(value: torch.Tensor) -> float:
    if dist.is_initialized():
        value = value.clone()
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return float(value)


@torch.no_grad()
def evaluate(
    parts: Parts, held: list[torch.Tensor], device: torch.device
) -> tuple[dict, torch.Tensor | None]:
    """PSNR, SSIM and LPIPS of the held-out clips' reconstructions (posterior mode); every rank runs all of
    them (FSDP needs each rank in each forward). Also returns the first clip's reconstruction."""
    if not held:
        return {}, None
    sums = {"psnr": 0.0, "ssim": 0.0, "lpips": 0.0}
    first = None
    for video in held:
        with _autocast(device):
            recon = parts.ae(video[None].to(device))[0].float()
        first = recon[0].cpu() if first is None else first
        sums["psnr"] += float(losses.psnr(recon, video[None].to(device))[0])
        sums["ssim"] += float(losses.ssim(recon, video[None].to(device))[0])
        sums["lpips"] += float(losses.lpips_distance(parts.lpips, recon, video[None].to(device))[0])
    return {f"val_{k}": v / len(held) for k, v in sums.items()}, first


def write_grid(path: Path, original: torch.Tensor, recon: torch.Tensor) -> None:
    """Originals in the top row, reconstructions below, one column per frame."""
    from PIL import Image

    top, bottom = tensor_to_frames(original), tensor_to_frames(recon)
    grid = np.concatenate([np.concatenate(list(top), axis=1), np.concatenate(list(bottom), axis=1)], axis=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    Image.fromarray(grid).save(tmp)
    tmp.replace(path)


def run(
    profile: RunProfile,
    src: str | os.PathLike,
    run_dir: str | os.PathLike,
    on_step: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Fine-tune to `tokenizer.finetune.steps` (resuming from RUN's latest checkpoint); returns a summary."""
    from vidforge.tokenizers.tokenize import runtime_scope

    with runtime_scope(profile) as runtime:
        return _run(profile, src, Path(run_dir), runtime, on_step)


def _run(
    profile: RunProfile,
    src: str | os.PathLike,
    run_dir: Path,
    runtime: Runtime,
    on_step: Callable[[int, int], None] | None,
) -> dict[str, Any]:
    ft = profile.tokenizer.finetune
    device = runtime.device
    vae, init = build_vae(profile)  # a wrong tokenizer.path is refused before any clip is decoded
    _check_shapes(vae, profile)
    clips = load_clips(src, ft.frames, ft.size)
    held = [v for _, v in clips[: ft.holdout]]
    train = [v for _, v in clips[ft.holdout :]]
    if len(train) < ft.batch * runtime.world:
        raise UserInputError(
            f"{src}: {len(train)} training clip(s) after holding out {ft.holdout}, fewer than one step needs "
            f"(tokenizer.finetune.batch={ft.batch} x {runtime.world} ranks); add clips or lower them"
        )
    torch.manual_seed(ft.seed)
    ae = Autoencoder(vae.to(device).train())
    disc = PatchDiscriminator3D(ft.disc_channels).to(device)
    _shard([ae, disc], runtime)
    parts = Parts(
        ae,
        disc,
        torch.optim.AdamW(ae.parameters(), lr=ft.lr, betas=(0.9, 0.99), weight_decay=0.0),
        torch.optim.AdamW(disc.parameters(), lr=ft.disc_lr, betas=(0.5, 0.9), weight_decay=0.0),
        losses.build_lpips(ft.lpips_net, ft.lpips_backbone).to(device),
    )
    _init_state(parts.opt_g)
    _init_state(parts.opt_d)
    ckpt = CheckpointManager(run_dir, keep=ft.keep_checkpoints)
    start = ckpt.latest() or 0
    if start:
        ckpt.load(start, [ae, disc], [parts.opt_g, parts.opt_d], None)
    metrics = MetricsLog(run_dir, runtime.is_main, resume_step=start)
    if runtime.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / "init.json", json.dumps(init, indent=1))
    first_eval = last_eval = None
    if start == 0 and held:
        first_eval, _ = evaluate(parts, held, device)
        metrics.write({"step": start, **first_eval})
    record: dict[str, Any] = {}
    for step in range(start, ft.steps):
        picks = step_indices(step, len(train), ft.batch * runtime.world, ft.seed)
        mine = picks[runtime.rank * ft.batch : (runtime.rank + 1) * ft.batch]
        video = torch.stack([train[i] for i in mine]).to(device)
        latent = (vae.config.z_dim, *vae_latent_shape(vae, ft.frames, ft.size))
        noise = torch.stack([posterior_noise(latent, ft.seed, step, i) for i in mine]).to(device)
        record = train_step(parts, video, noise, step, profile, device)
        done = step + 1
        if done % ft.log_every == 0 or done == ft.steps:
            metrics.write({"step": done, "lr": parts.opt_g.param_groups[0]["lr"], **record})
        if held and (done % ft.eval_every == 0 or done % ft.grid_every == 0 or done == ft.steps):
            last_eval, recon0 = evaluate(parts, held, device)
            metrics.write({"step": done, **last_eval})
            if runtime.is_main and (done % ft.grid_every == 0 or done == ft.steps):
                write_grid(run_dir / "grids" / f"step_{done:08d}.png", held[0], recon0)
        if done % ft.checkpoint_every == 0 or done == ft.steps:
            ckpt.save(done, [ae, disc], [parts.opt_g, parts.opt_d], None, {})
        if on_step is not None:
            on_step(done, ft.steps)
    metrics.close()
    state = _full_state(ae)
    if runtime.is_main:
        final = type(vae).from_config(vae.config)
        final.load_state_dict({k.removeprefix("vae."): v for k, v in state.items()})
        final.save_pretrained(run_dir / "vae")
    if dist.is_initialized():
        dist.barrier()
    return {
        "run_dir": str(run_dir),
        "vae": str(run_dir / "vae"),
        "steps": ft.steps,
        "resumed_from": start,
        "train_clips": len(train),
        "held_out": len(held),
        "init": init["describe"],
        **{f"final_{k}": round(v, 6) for k, v in record.items()},
        **{f"start_{k}": round(v, 4) for k, v in (first_eval or {}).items()},
        **{f"end_{k}": round(v, 4) for k, v in (last_eval or {}).items()},
    }

"""The peer of the 1.3B comparison: diffusers' WanTransformer3DModel at the shape of PEERS (shapes.py),
timed the way `vidforge bench train|infer` times vidforge's model, in its own process.

    python bench/gpu/peer_wan.py train|infer --device cuda --latent 21 60 104 --text-tokens 512 \
        [--recompute full] [--compile] [--smoke]

train: one step of bf16 autocast forward (fp32 weights), an MSE loss against a random target, backward
and fused AdamW; `--recompute full` is diffusers' gradient checkpointing of every block, `--compile`
compiles each block (vidforge's train.compile does the same). infer: one forward in bf16 weights on a
batch of 2, the doubled batch of classifier-free guidance. Prints one JSON object: the median step time,
the peak of torch.cuda.max_memory_allocated over one step, parameters, and MFU from
vidforge.models.flops applied to Wan's shape (vidforge's formula for both models, so the MFUs compare).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shapes import PEERS, SMOKE_PEER_OVERRIDES  # noqa: E402


def wan_config(smoke: bool) -> dict:
    config = dict(PEERS["wan-1.3b"]["diffusers"])
    if smoke:
        config.update(SMOKE_PEER_OVERRIDES["diffusers"])
    return config


def flops_formula_model(config: dict):
    """vidforge's Model section of Wan's shape, to count Wan's FLOPs with vidforge's formula. Wan's
    per-block modulation is a learned table (no matmul) and vidforge's full-rank one costs batch x
    hidden^2 per block: noise at 32K tokens."""
    from vidforge.models import model_config

    return model_config(
        "tiny",
        layers=config["num_layers"],
        hidden=config["num_attention_heads"] * config["attention_head_dim"],
        heads=config["num_attention_heads"],
        mlp_hidden=config["ffn_dim"],
        in_channels=config["in_channels"],
        text_dim=config["text_dim"],
        patch=tuple(config["patch_size"]),
        adaln_lora_rank=0,
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("train", "infer"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--latent", type=int, nargs=3, default=(21, 60, 104), metavar=("T", "H", "W"))
    ap.add_argument("--text-tokens", type=int, default=512)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--recompute", choices=("none", "full"), default="none")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument(
        "--accelerator", default="h100", help="profile accelerator whose peak is MFU's denominator"
    )
    ap.add_argument("--smoke", action="store_true", help="the tiny CPU stand-in of shapes.py")
    args = ap.parse_args(argv)

    import torch
    from diffusers import WanTransformer3DModel

    from vidforge.bench.timing import time_calls
    from vidforge.models import count_parameters, forward_flops, model_config, token_grid, train_step_flops
    from vidforge.profile.cluster import KNOWN_ACCELERATORS

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    config = wan_config(args.smoke)
    torch.manual_seed(0)
    with device:  # built where it runs: 1.4B parameters initialised on the CPU take a while
        model = WanTransformer3DModel(**config)
    params = sum(p.numel() for p in model.parameters())
    t, h, w = args.latent
    batch = 1 if args.mode == "train" else 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, config["in_channels"], t, h, w, generator=g).to(device)
    text = torch.randn(batch, args.text_tokens, config["text_dim"], generator=g).to(device)
    timestep = torch.randint(0, 1000, (batch,), generator=g).to(device)
    autocast_dtype = torch.bfloat16 if cuda else torch.float32

    if args.mode == "train":
        if args.recompute == "full":
            model.enable_gradient_checkpointing()
        if args.compile:
            for block in model.blocks:
                block.compile()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
        target = torch.randn_like(x)

        def step() -> None:
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=cuda):
                out = model(x, timestep, text, return_dict=False)[0]
            loss = torch.nn.functional.mse_loss(out.float(), target)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    else:
        model = model.to(autocast_dtype).eval()
        text = text.to(autocast_dtype)
        x = x.to(autocast_dtype)

        @torch.no_grad()
        def step() -> None:
            model(x, timestep, text, return_dict=False)

    timing = time_calls(step, args.warmup, args.repeats, device)
    peak_gib = None
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        step()
        peak_gib = torch.cuda.max_memory_allocated(device) / 2**30
    grid = token_grid((t, h, w), tuple(config["patch_size"]))
    formula = flops_formula_model(config)
    if args.mode == "train":
        flops = train_step_flops(formula, [grid] * batch, args.text_tokens)  # model FLOPs: MFU, not HFU
    else:
        flops = forward_flops(formula, [grid] * batch, args.text_tokens).forward
    peak = KNOWN_ACCELERATORS[args.accelerator]["peak_bf16_flops"]
    vidforge_cfg = model_config(
        PEERS["wan-1.3b"]["vidforge_preset"], **(SMOKE_PEER_OVERRIDES["vidforge"] if args.smoke else {})
    )
    print(
        json.dumps(
            {
                "peer": "diffusers.WanTransformer3DModel",
                "mode": args.mode,
                "device": str(device),
                "tokens": grid[0] * grid[1] * grid[2] * batch,
                "step_time_s": timing.median,
                "step_times_s": list(timing.samples),
                "peak_memory_gib": peak_gib,
                "parameters": params,
                "vidforge_parameters": count_parameters(vidforge_cfg),
                "flops": flops,
                "mfu": flops / timing.median / peak,
            }
        )
    )


if __name__ == "__main__":
    main()

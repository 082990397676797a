"""The sizes each measurement runs at: on the GPU (the issue's shapes) and in the CPU smoke run (the
same code at tiny shapes, so that CI keeps the driver from rotting). One table per concern, so a new
preset or shape is one line."""

from __future__ import annotations

from dataclasses import dataclass

# The 1.3B comparison: vidforge's `wan2.1-1.3b` (family wan: the same network, vidforge's implementation,
# trained with rectified flow) beside diffusers' WanTransformer3DModel of the Wan2.1-1.3B shape.
PEERS: dict[str, dict] = {
    "wan-1.3b": {
        "vidforge_preset": "wan2.1-1.3b",  # the same network, vidforge's implementation (family wan)
        # diffusers' WanTransformer3DModel arguments of Wan2.1-T2V-1.3B (its config.json).
        "diffusers": {
            "patch_size": (1, 2, 2),
            "num_attention_heads": 12,
            "attention_head_dim": 128,
            "in_channels": 16,
            "out_channels": 16,
            "text_dim": 4096,
            "freq_dim": 256,
            "ffn_dim": 8960,
            "num_layers": 30,
            "cross_attn_norm": True,
            "qk_norm": "rms_norm_across_heads",
            "eps": 1e-6,
        },
    },
}

# The smoke run's stand-in for the peer pair: the same two networks, two layers, hidden 64.
SMOKE_PEER_OVERRIDES = {
    "vidforge": {
        "layers": 2,
        "hidden": 64,
        "heads": 4,
        "mlp_hidden": 128,
        "text_dim": 32,
    },
    "diffusers": {
        "num_layers": 2,
        "num_attention_heads": 4,
        "attention_head_dim": 16,
        "ffn_dim": 128,
        "text_dim": 32,
    },
}


@dataclass(frozen=True)
class Shapes:
    """Everything size-like one suite run uses. Latents are (frames, height, width) before the model's
    1x2x2 patches: 21 x 60 x 104 is 81 frames of 480x832 through a 4x8x8 VAE, 32,760 tokens."""

    device: str
    accelerator: str
    attention_seq_lens: tuple[int, ...]
    latent: tuple[int, int, int]
    text_tokens: int
    memory_latents: dict[str, tuple[int, int, int]]
    warmup: int
    repeats: int
    infer_steps: int
    # The 1.3B step at 32K tokens needs activation recompute to fit 80 GB (vidforge bench plan of the wan
    # preset: 153 GiB without, 31.4 GiB with full; the H200 measured 33.3 GiB before the one-sample row
    # broadcast its modulation): both vidforge and the peer run it with full recompute.
    recompute: str
    caption_clips: int
    caption_size: tuple[int, int]
    caption_models: tuple[str, str]
    tokenize_clips: int
    tokenize_size: tuple[int, int]  # (height, width), the one bucket
    tokenize_frames: int  # 4k + 1
    # diffusers AutoencoderKLWan arguments: {} is Wan2.1's VAE (random weights, the real architecture).
    vae: dict
    # The correctness step: pytest-xdist workers sharing the one GPU (the tests' models are small, so
    # their time is process start-up, compile and the CPU references: 192 s on one process on the H200),
    # and each test's limit, so one hung test costs its own row.
    test_workers: int = 1
    test_timeout_s: int = 900
    # Issue 48's rows (bench/gpu/ahead_steps.py). The 14B-width block stack: Wan2.1-14B's block (hidden
    # 5120, 40 heads, FFN 13824) at Megatron-Bridge's 37,440 tokens (24 x 60 x 104 latents: 93 frames of
    # 480x832), a few layers so that one GPU holds its AdamW states.
    stack_layers: int = 4
    stack_latent: tuple[int, int, int] = (24, 60, 104)
    # Wan2.2 TI2V-5B at its published 704x1280, 121 frames (the Wan2.2 VAE's 4x16x16: 31 x 44 x 80 latents
    # before its 1x2x2 patches, 27,280 tokens); Wan2.1-I2V-14B at 480x832, 81 frames (21 x 60 x 104, 32,760
    # tokens and CLIP's 257 image tokens), a LoRA fine-tune of the whole depth as a user runs it.
    ti2v_latent: tuple[int, int, int] = (31, 44, 80)
    i2v_latent: tuple[int, int, int] = (21, 60, 104)
    i2v_lora_rank: int = 32
    # sliding-tile attention's window (tiles per axis) and video sparse attention's kept tiles
    sparse_window: tuple[int, int, int] = (3, 3, 5)
    sparse_tile: tuple[int, int, int] = (6, 8, 8)
    sparse_topk: int = 32
    # block swap of a LoRA fine-tune of the 1.3B and the offload of its checkpointed blocks' inputs
    swap_blocks: int = 10
    # a distilled student's calls (DMD2, 4 levels) against the teacher's published 50 guided steps
    student_calls: int = 4
    teacher_steps: int = 50


GPU = Shapes(
    device="cuda",
    accelerator="h100",
    attention_seq_lens=(4096, 16384, 32760),
    latent=(21, 60, 104),
    text_tokens=512,
    memory_latents={"8K": (21, 30, 52), "32K": (21, 60, 104)},
    warmup=2,
    repeats=5,
    infer_steps=2,
    recompute="full",
    caption_clips=32,
    caption_size=(640, 360),
    caption_models=("ViT-L-14", "coca_ViT-B-32"),
    tokenize_clips=8,
    tokenize_size=(256, 448),
    tokenize_frames=33,
    vae={},
    test_workers=4,
    test_timeout_s=150,
)

SMOKE = Shapes(
    device="cpu",
    accelerator="cpu",
    attention_seq_lens=(64,),
    latent=(2, 4, 4),
    text_tokens=8,
    memory_latents={"8": (2, 4, 4)},
    warmup=0,
    repeats=1,
    infer_steps=1,
    recompute="full",
    caption_clips=1,
    caption_size=(64, 48),
    caption_models=("tiny-clip", "tiny-coca"),
    tokenize_clips=2,
    tokenize_size=(32, 48),
    tokenize_frames=5,
    vae={
        "base_dim": 8,
        "z_dim": 4,
        "dim_mult": [1, 2, 2, 2],
        "num_res_blocks": 1,
        "latents_mean": [0.0] * 4,
        "latents_std": [1.0] * 4,
    },
    stack_layers=2,
    stack_latent=(2, 4, 4),
    ti2v_latent=(2, 4, 4),
    i2v_latent=(2, 4, 4),
    i2v_lora_rank=4,
    sparse_window=(1, 1, 1),
    sparse_tile=(1, 2, 2),
    sparse_topk=1,
    swap_blocks=1,
    test_workers=1,  # every test skips here: one process (test_gpu_suite.py runs the plugin under xdist)
    test_timeout_s=120,
)

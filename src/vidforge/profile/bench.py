"""`bench`: what `vidforge bench` measures and plans with: the synthetic workload and how long to time it."""

from __future__ import annotations

from pydantic import Field, model_validator

from vidforge.section import Section


class Bench(Section):
    """The synthetic sample `vidforge bench train|infer|plan` uses (one clip of latents and a caption per
    sample; `train.micro_batch` samples per rank), and the timing protocol (warm-up, then the median of
    `repeats` measurements). Tokens per sample = (latent_frames/pt) x (latent_height/ph) x
    (latent_width/pw) for the model's patch (pt, ph, pw); e.g. 18 x 128 x 128 latents with patch
    (1, 2, 2) are 18 x 64 x 64 = 73,728 tokens (72K)."""

    latent_frames: int = Field(4, ge=1)
    """Latent frames of one synthetic sample (after the tokenizer's temporal compression)."""
    latent_height: int = Field(16, ge=1)
    """Latent rows of one synthetic sample."""
    latent_width: int = Field(16, ge=1)
    """Latent columns of one synthetic sample."""
    text_tokens: int = Field(16, ge=1)
    """Caption tokens per sample (cross-attention keys)."""
    warmup: int = Field(2, ge=0)
    """Untimed steps (or calls) before measuring: allocator, autotuning and compile settle here."""
    repeats: int = Field(5, ge=1)
    """Timed steps (or calls); the reported time is their median."""
    attention_seq_lens: tuple[int, ...] = (256, 1024)
    """Sequence lengths `vidforge bench attention` times each backend at."""
    memory_headroom: float = Field(0.9, gt=0, le=1)
    """Fraction of cluster.accelerator.memory_gib a layout may plan to use (the rest: allocator
    fragmentation, CUDA context, NCCL buffers not modelled)."""
    achievable_mfu: float = Field(0.5, gt=0, le=1)
    """Fraction of the accelerator's peak that `bench plan` assumes the matmuls reach when it predicts
    step times (NeMo's DiT runs report 40-55% on H100)."""

    @model_validator(mode="after")
    def _check(self) -> Bench:
        if not self.attention_seq_lens or min(self.attention_seq_lens) < 1:
            raise ValueError(
                f"attention_seq_lens: give one or more positive lengths, got {list(self.attention_seq_lens)}"
            )
        return self

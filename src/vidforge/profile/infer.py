"""`infer`: what `vidforge infer` generates. Sampler, steps and guidance scale are in `diffusion`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vidforge.section import Section


class StepCache(Section):
    """Step caching (TeaCache's rule, `vidforge.sampling.step_cache`): skip the network at sampling steps
    whose input barely moved since the last computed one, reusing that step's residual."""

    threshold: float = Field(0.0, ge=0)
    """Skip model calls while the accumulated relative L1 change of the first block's modulated input
    (rescaled, see `rescale`) since the last computed call stays below this; 0 computes every call
    (off, the outputs bitwise those without caching). docs/benchmarks.md (Step caching) measures the
    demo's calls and prompt check at several values."""
    rescale: Literal["auto", "identity", "wan2.1-t2v-1.3b", "wan2.1-t2v-14b"] = "auto"
    """The polynomial that maps the input's change to the output's: TeaCache's published fit for a
    Wan2.1 T2V model (measured on its timestep embedding, as TeaCache does), or the identity (the change
    itself, on the first block's modulated input). auto: the Wan2.1 fit for a Wan of a published size
    (1536 x 30 layers: 1.3B, 5120 x 40: 14B), the identity otherwise."""


class Infer(Section):
    """Output size, seed and writing of sampled videos."""

    frames: int = Field(9, ge=1)
    """Frames of each generated video, in pixel space. Must fit the tokenizer's temporal compression
    (4k+1 for a 4x causal VAE)."""
    height: int = Field(64, ge=8)
    """Height in pixels; a multiple of the tokenizer's spatial compression times the patch size."""
    width: int = Field(64, ge=8)
    """Width in pixels; same rule as height."""
    seed: int = Field(0, ge=0, le=2**62)
    """Seed of the initial noise: the same seed and prompt give the same video (each prompt adds its
    index; torch's generators take 64 bits)."""
    negative_prompt: str = ""
    """Caption of the unconditional guidance branch; empty: the family's (`FamilySpec.negative_prompt`:
    wan encodes the empty caption, as WanPipeline does; vidforge's own models their learned null caption)."""
    batch_size: int = Field(4, ge=1)
    """Prompts sampled together."""
    fps: int = Field(8, ge=1)
    """Frame rate of the written MP4 (a published folder's profile sets its family's: Wan 16, TI2V-5B 24)."""
    crf: int = Field(18, ge=0, le=51)
    """x264 quality of the written MP4 (lower is better)."""
    scalefusion_slices_t: int = Field(4, ge=1)
    """ScaleFusion (`vidforge infer --nproc` with a sequential ST-DiT): N_T, the frame slices spatial
    attention is cut into, so each slice's all-to-all overlaps other slices' compute."""
    scalefusion_slices_s: int = Field(4, ge=1)
    """ScaleFusion: N_S, the position slices temporal attention, cross-attention and the MLP are cut into."""
    scalefusion_lookahead_t: int = Field(1, ge=1)
    """ScaleFusion: L_T, how many frame slices' all-to-alls are in flight ahead of the one computed (the
    first L_T leave in pieces during the temporal phase before); each costs a slice's receive buffer."""
    scalefusion_lookahead_s: int = Field(1, ge=1)
    """ScaleFusion: L_S, the same for the position slices (the first L_S leave during the spatial phase)."""
    cache: StepCache = StepCache()
    """Step caching: model calls skipped where the input barely changed (one process only)."""
    tp: int = Field(1, ge=1)
    """Tensor-parallel degree of `vidforge infer --nproc N` (and `bench infer --nproc N`), for a model that
    does not fit one GPU: the training's TP plan (its sequence parallel included) over groups of tp
    ranks. Must divide N; the other N / tp ranks split the guidance branches (CFG-parallel, when guidance
    is on and they are even) and then the token sequence (parallel.cp_impl). Must divide model.heads and
    model.mlp_hidden. E.g. --nproc 4 with tp 2 and guidance: tp 2 x CFG-parallel 2."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        # The first_parts fields meant parts of the first slice's all-to-all, not a lookahead: a profile
        # that sets them is told the new name rather than read with the new meaning.
        for axis in ("t", "s") if isinstance(data, dict) else ():
            if f"scalefusion_first_parts_{axis}" in data:
                raise ValueError(
                    f"scalefusion_first_parts_{axis}: renamed infer.scalefusion_lookahead_{axis} (how many "
                    "slices' all-to-alls run ahead, 1 by default); set that instead"
                )
        return data

"""`diffusion`: the training objective (EDM, or rectified flow) and the sampler used at inference."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vidforge import sampler_registry
from vidforge.section import Section

# The names are the registry's (one list, which `infer --help` and `bench infer` show too).
ObjectiveName = Literal[sampler_registry.OBJECTIVE_NAMES]  # type: ignore[valid-type]
SamplerName = Literal[sampler_registry.SAMPLER_NAMES]  # type: ignore[valid-type]
FEW_STEP = sampler_registry.FEW_STEP


class Diffusion(Section):
    """The objective, its training noise distribution, and sampling. EDM defaults are the paper's."""

    objective: ObjectiveName = Field("edm", description=sampler_registry.objectives_doc())
    sigma_data: float = Field(0.5, gt=0)
    """Standard deviation of the (normalised) latents; sets c_skip, c_out and c_in."""
    p_mean: float = -1.2
    """Mean of log(sigma) during training (log-normal noise distribution)."""
    p_std: float = Field(1.2, gt=0)
    """Standard deviation of log(sigma) during training."""
    sigma_min: float = Field(0.002, gt=0)
    """Smallest sigma of the sampling schedule."""
    sigma_max: float = Field(80.0, gt=0)
    """Largest sigma of the sampling schedule (where sampling starts from pure noise)."""
    rho: float = Field(7.0, gt=0)
    """Karras schedule exponent: larger spends more steps at small sigma."""
    sampler: SamplerName = Field(
        sampler_registry.samplers_of("edm")[0], description=sampler_registry.samplers_doc()
    )
    few_step_levels: tuple[float, ...] = ()
    """With sampler=few-step: the student's noise levels (sigma, or flow time), decreasing, the first where
    sampling starts from pure noise; `diffusion.steps` is their count."""
    few_step_noise: Literal["fresh", "implied"] = "implied"
    """With sampler=few-step, how each clean estimate is noised to the next level: the noise its input
    implies (`implied`, a deterministic DDIM step: over levels L the sampler is flow-euler/DDIM over L
    and 0), or `fresh` noise (DMD2's and FastVideo's multi-step generator). `implied` by default: a
    student starts as its teacher, and the demo's teacher passes the demo's prompt check 6/6 at 4 steps
    under `implied` but 4/6 under `fresh` (docs/benchmarks.md, Few-step distillation). A train.distill run
    trains the student under the rule it samples with (`vidforge.diffusion.dmd.few_step_noisy`)."""
    steps: int = Field(32, ge=1)
    """Sampling steps (sigma levels); Heun evaluates the model about twice per step."""
    churn: float = Field(0.0, ge=0)
    """EDM S_churn: stochasticity added per step (0 is deterministic); only the heun sampler takes it."""
    guidance: float = Field(5.0, ge=0)
    """Classifier-free guidance scale; 1 disables the unconditional branch."""
    guidance_rescale: float = Field(0.0, ge=0, le=1)
    """Guidance rescale (Lin et al. 2024, "Common Diffusion Noise Schedules and Sample Steps Are Flawed"):
    the guided clean estimate mixed by this weight with itself scaled to the conditional estimate's
    standard deviation (per sample), as diffusers' guidance_rescale (LTX-2: 0.7). 0: off."""
    guidance_2: float | None = Field(None, ge=0)
    """A two-expert model (model.experts=2) only: the low-noise expert's guidance scale (diffusers'
    guidance_scale_2; Wan2.2 T2V-A14B: 3 against the high-noise expert's 4). None: `guidance` for both."""
    caption_dropout: float = Field(0.1, ge=0, le=1)
    """Probability that training replaces a caption by the learned null embedding (makes CFG possible)."""
    image_condition: float = Field(0.0, ge=0, le=1)
    """Probability that a training clip is conditioned on its own first latent frame (image-to-video, for
    a model with `model.expand_timesteps`, Wan2.2 TI2V and LTX-2): that frame enters clean, its tokens at noise
    level 0, and is left out of the loss, as diffusers' pipeline samples it; the rest of the clip is noised
    at the clip's level. The causal VAE encodes the first latent frame from the first pixel frame alone,
    so it is the image's latent. 0 trains text-to-video only, 1 image-to-video only."""
    flow_time_sampling: Literal["uniform", "logit-normal"] = "logit-normal"
    """Flow training times: `uniform` t ~ U(0, 1), or `logit-normal` t = sigmoid(N(mean, std^2)) (SD3)."""
    flow_logit_mean: float = 0.0
    """Mean of the logit-normal training times."""
    flow_logit_std: float = Field(1.0, gt=0)
    """Standard deviation of the logit-normal training times."""
    flow_shift: float = Field(1.0, gt=0)
    """Flow time shift t -> s t / (1 + (s - 1) t), in training and sampling: more steps at high noise for
    larger frames (Wan2.1: 3 at 480p, 5 at 720p; 1 leaves t as it is)."""
    flow_shift_tokens: tuple[int, float, int, float] | None = None
    """Flow shift by each sample's video token count (FLUX's and LTX-2's dynamic shifting), in training
    and sampling, in place of flow_shift: [n0, mu0, n1, mu1], the shift e^mu with mu linear in the tokens
    through (n0, mu0) and (n1, mu1) (LTX-2: [1024, 0.95, 4096, 2.05]). In training it makes the
    logit-normal times LTX-Video-Trainer's shifted logit-normal (mean mu). null: flow_shift at every size."""
    flow_shift_terminal: float | None = Field(None, gt=0, lt=1)
    """Sampling: the shifted times stretched (1 - t scaled) so that the last step's is this (diffusers'
    shift_terminal; LTX-2: 0.1). null: not stretched."""
    flow_schedule_end: float = Field(0.001, ge=0, lt=1)
    """Flow sampling's steps: `steps` of `steps + 1` times evenly spaced from 1 to this (the last dropped),
    then shifted by flow_shift. 0.001: Wan's pipelines' (1000 training timesteps); 0: HunyuanVideo-1.5's
    pipeline's (linspace(1, 0, steps + 1))."""
    flow_prediction: Literal["velocity", "clean"] = "velocity"
    """What the network outputs under the flow objective: `velocity` noise - x0 (Wan2.1, SD3; what
    published flow weights predict), or `clean` x0 itself (Li & He 2025, "Back to Basics: Let Denoising
    Generative Models Denoise"), trained on the velocity error it implies. `clean` is for models whose
    latent tokens are as wide as the network: noise fills every channel of a token, clean data lies
    near a few of them, so a network too narrow to carry noise through can still output clean data."""

    @model_validator(mode="before")
    @classmethod
    def _sampler_of_the_objective(cls, data: object) -> object:
        """Left out, the sampler is the objective's default (its first in the registry)."""
        if (
            isinstance(data, dict)
            and "sampler" not in data
            and data.get("objective") in sampler_registry.OBJECTIVE_NAMES
        ):
            return {**data, "sampler": sampler_registry.samplers_of(data["objective"])[0]}
        return data

    @model_validator(mode="after")
    def _check(self) -> Diffusion:
        fits = sampler_registry.samplers_of(self.objective)
        if self.sampler == FEW_STEP:
            self._check_few_step()
        elif self.sampler not in fits:
            raise ValueError(
                f"sampler: {self.sampler} does not sample the {self.objective} objective; use one of {', '.join(fits)}"
            )
        if self.churn > 0 and not sampler_registry.sampler(self.sampler).stochastic:
            takes = [
                s.name for s in sampler_registry.SAMPLERS if s.stochastic and s.objective == self.objective
            ]
            raise ValueError(
                f"churn: the {self.sampler} sampler is deterministic; set diffusion.churn=0"
                + (f" or diffusion.sampler={takes[0]}" if takes else "")
            )
        if self.objective != "flow" and self.flow_prediction != "velocity":
            raise ValueError(
                f"flow_prediction: only the flow objective has it (EDM preconditions its own output); "
                f"set diffusion.objective=flow or drop flow_prediction={self.flow_prediction}"
            )
        if self.flow_shift_tokens is not None and self.flow_shift_tokens[0] == self.flow_shift_tokens[2]:
            raise ValueError(
                "flow_shift_tokens: [n0, mu0, n1, mu1] needs two token counts n0 != n1, got "
                f"{list(self.flow_shift_tokens)}"
            )
        if self.sigma_min >= self.sigma_max:
            raise ValueError(
                f"sigma_min: must be below diffusion.sigma_max={self.sigma_max}, got {self.sigma_min}"
            )
        return self

    def _check_few_step(self) -> None:
        levels = self.few_step_levels
        if (
            not levels
            or any(v <= 0 for v in levels)
            or any(a <= b for a, b in zip(levels, levels[1:], strict=False))
        ):
            raise ValueError(
                "few_step_levels: sampler=few-step needs the student's noise levels, positive and "
                f"decreasing (a train.distill run writes them), got {list(levels)}"
            )
        if self.objective == "flow" and levels[0] > 1:
            raise ValueError(f"few_step_levels: flow times are at most 1, got {levels[0]}")
        if self.steps != len(levels):
            raise ValueError(
                f"steps: sampler=few-step takes one step per few_step_levels entry; set steps={len(levels)}"
            )

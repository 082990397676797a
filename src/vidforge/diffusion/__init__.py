"""Diffusion as pure math: objectives (EDM) with their preconditioning and loss targets, the Karras
schedule, Heun and RES samplers, classifier-free guidance. No weights live here."""

from vidforge.diffusion.edm import EDM
from vidforge.diffusion.from_profile import build_objective, sample
from vidforge.diffusion.guidance import classifier_free_guidance
from vidforge.diffusion.objective import Objective
from vidforge.diffusion.samplers import Denoiser, heun_sampler, res_sampler
from vidforge.diffusion.schedule import karras_sigmas

__all__ = [
    "EDM",
    "Denoiser",
    "Objective",
    "build_objective",
    "classifier_free_guidance",
    "heun_sampler",
    "karras_sigmas",
    "res_sampler",
    "sample",
]

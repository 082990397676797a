"""EDM diffusion as pure math: preconditioning and loss, the Karras schedule, Heun and RES samplers,
classifier-free guidance. No weights live here."""

from vidforge.diffusion.edm import EDM
from vidforge.diffusion.guidance import classifier_free_guidance, model_denoiser
from vidforge.diffusion.samplers import Denoiser, heun_sampler, res_sampler, sample
from vidforge.diffusion.schedule import karras_sigmas

__all__ = [
    "EDM",
    "Denoiser",
    "classifier_free_guidance",
    "heun_sampler",
    "karras_sigmas",
    "model_denoiser",
    "res_sampler",
    "sample",
]

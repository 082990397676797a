"""vidforge: raw videos to a trained video diffusion model and back."""

__version__ = "0.1.0"

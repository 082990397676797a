"""Sampling videos from a model, shared by `vidforge infer` and training's validation samples (below
both): the guided denoiser and the sampler's loop over latents (`latents`), step caching (`step_cache`),
the latent shape a profile's video size gives (`shape`), and writing MP4s and contact sheets (`writers`)."""

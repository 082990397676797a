"""LTX-2 and LTX-2.3 (Lightricks), the video path: its network (network.py, diffusers'
LTX2VideoTransformer3DModel's video stream with the audio cross-attention off; LTX-2.3's gated attention,
prompt modulation and unprojected caption included), its `model` section (config.py), how a published
folder reads (published.py: shape, flow objective, the scheduler's resolution-dependent shift, VAE
compression, Gemma 3 and its connector, the pipeline's fps, guidance, size, frames, steps, negative prompt)
and weight import/export (weights.py, bitwise, the audio stream's tensors carried untouched).

Not in `families.REGISTRY` yet: its SPEC (presets, TP plan, LoRA targets, block scopes) and the typed
model section in the profile's union come with registration; the audio stream, packed rows, caption
dropout, tokenize with its VAE and connector, and infer against the pipeline (its STG, guidance rescale and
shift_terminal included) are not built."""

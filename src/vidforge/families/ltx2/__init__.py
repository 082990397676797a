"""LTX-2 (Lightricks), the video path: its network (network.py, diffusers' LTX2VideoTransformer3DModel's
video stream with the audio cross-attention off) and its `model` section (config.py). Not in
`families.REGISTRY` yet: the published-folder reading, weight import/export, TP plan and presets that its
SPEC names come next."""

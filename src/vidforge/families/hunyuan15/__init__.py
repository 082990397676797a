"""The hunyuan15 family: HunyuanVideo-1.5 (text- and image-to-video), diffusers'
`HunyuanVideo15Transformer3DModel` module for module (`network`), its shape as the profile holds it
(`config`)."""

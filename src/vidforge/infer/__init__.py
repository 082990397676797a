"""`vidforge infer`: prompts to videos through the text encoder, the sampler, the DiT and the tokenizer."""

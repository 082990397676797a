"""`vidforge infer` against a diffusers Wan pipeline with DEFAULT sampling arguments (no negative prompt, no
guidance, shift or scheduler given): what each family and mode's parity test runs. Only the size, the
steps and the noise are given, to both; vidforge's negative caption, guidance, shift, sampler and frame
rate are the folder's defaults (`vidforge.families.wan`)."""

from __future__ import annotations

from pathlib import Path

import torch

PROMPT = "a red square moving right"


def vidforge_infer(
    folder: Path, out: Path, sets: list[str], monkeypatch, image: Path | None = None, lora: Path | None = None
) -> tuple[torch.Tensor, float, dict]:
    """(the latents `vidforge infer -c folder [--lora lora]` decodes (1, C, T, H, W), the written MP4's frame
    rate, its samples.jsonl record) for PROMPT at infer.seed 0. The latents are read on their way to the
    real decoder."""
    import json

    import av

    import vidforge.infer.run as output
    from vidforge.infer.run import run

    seen: list[torch.Tensor] = []
    decode = output.decode

    def recording(tokenizer, latents):
        seen.append(latents.clone())
        return decode(tokenizer, latents)

    monkeypatch.setattr(output, "decode", recording)
    result = run(folder, [PROMPT], out, overrides=sets, image=image, lora=lora)
    with av.open(result.videos[0]) as container:
        fps = float(container.streams.video[0].average_rate)
    record = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    return seen[0][None], fps, record


def noise(shape) -> torch.Tensor:
    """The noise vidforge draws for seed 0 (`initial_noise`), handed to the pipeline as its latents."""
    from vidforge.sampling.latents import initial_noise

    return initial_noise([0], shape)

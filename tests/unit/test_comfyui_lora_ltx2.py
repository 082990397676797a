"""`vidforge model export RUN --to comfyui` of an LTX-2 LoRA, held to ComfyUI's rules (`tests/comfyui_fixtures.py`)
on its LTX-2 model, restated here from its source (the video path of `comfy/ldm/lightricks/av_model.py`'s
`LTXAVModel`, whose names are `model.py`'s `LTXVModel`'s: Lightricks' release's), and to diffusers' own
converters of that layout: `convert_ltx2_transformer_to_diffusers` brings the base from ComfyUI's names to
vidforge's (diffusers'), and `_convert_non_diffusers_ltx2_lora_to_diffusers` (what LTX2Pipeline's
`lora_state_dict` runs on a `diffusion_model.` LoRA) must turn our ComfyUI file back into our diffusers LoRA."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from comfyui_fixtures import comfyui_apply, trained_adapter_export  # noqa: E402

from vidforge.families.ltx2.model import LTX2Model  # noqa: E402
from vidforge.lora import WEIGHTS, load_adapter, merge  # noqa: E402
from vidforge.models import build_model  # noqa: E402
from vidforge.profile.train import Lora  # noqa: E402
from vidforge.weights.checkpoint import load_model, save_model  # noqa: E402

# Every linear layer of the network (LTX-2.3's head gates and per-step prompt modulation included).
TARGETS = [
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "to_gate_logits",
    "net.0.proj",
    "net.2",
    "linear_1",
    "linear_2",
]
TARGETS += ["linear", "proj_in", "proj_out"]
FREQ_DIM = 256  # Timesteps(num_channels=256)
LTX20 = {"layers": 2, "hidden": 16, "heads": 2, "in_channels": 8, "text_dim": 12}
LTX23 = {**LTX20, "text_dim": 16, "gated_attention": True, "prompt_modulation": True, "caption_projection": False,
         "ff_bias": False}  # fmt: skip


# ComfyUI's LTX-2 model, the video path's parameters only (names and shapes).
class CrossAttention(nn.Module):
    def __init__(self, dim: int, context: int) -> None:
        super().__init__()
        self.q_norm, self.k_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.to_q, self.to_k, self.to_v = (
            nn.Linear(dim, dim),
            nn.Linear(context, dim),
            nn.Linear(context, dim),
        )
        self.to_out = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(0.0))


class Block(nn.Module):  # BasicAVTransformerBlock's video half
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attn1, self.attn2 = CrossAttention(dim, dim), CrossAttention(dim, dim)
        self.ff = nn.Module()  # FeedForward: GELU_approx (proj), Dropout, Linear; mult 4
        self.ff.net = nn.Sequential(nn.Module(), nn.Dropout(0.0), nn.Linear(4 * dim, dim))
        self.ff.net[0].proj = nn.Linear(dim, 4 * dim)
        self.scale_shift_table = nn.Parameter(torch.empty(6, dim))


class ComfyLTXV(nn.Module):
    def __init__(self, cfg: LTX2Model) -> None:
        super().__init__()
        dim = cfg.hidden
        self.patchify_proj = nn.Linear(cfg.in_channels, dim)
        self.adaln_single = nn.Module()  # AdaLayerNormSingle
        self.adaln_single.emb = nn.Module()
        self.adaln_single.emb.timestep_embedder = nn.Module()
        self.adaln_single.emb.timestep_embedder.linear_1 = nn.Linear(FREQ_DIM, dim)
        self.adaln_single.emb.timestep_embedder.linear_2 = nn.Linear(dim, dim)
        self.adaln_single.linear = nn.Linear(dim, 6 * dim)
        self.caption_projection = nn.Module()  # PixArtAlphaTextProjection
        self.caption_projection.linear_1 = nn.Linear(cfg.text_dim, dim)
        self.caption_projection.linear_2 = nn.Linear(dim, dim)
        self.transformer_blocks = nn.ModuleList(Block(dim) for _ in range(cfg.layers))
        self.scale_shift_table = nn.Parameter(torch.empty(2, dim))
        self.proj_out = nn.Linear(dim, cfg.in_channels)


def to_diffusers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from diffusers.loaders.single_file_utils import convert_ltx2_transformer_to_diffusers

    return convert_ltx2_transformer_to_diffusers(
        {k.removeprefix("diffusion_model."): v for k, v in state.items()}
    )


def _adapter(cfg: LTX2Model, tmp_path: Path) -> tuple[Path, dict, int, Path]:
    torch.manual_seed(0)
    model = build_model(cfg, device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.02)
    base = save_model(model, tmp_path / "base")
    targets = [t for t in TARGETS if t != "to_gate_logits" or cfg.gated_attention]
    lora = Lora(rank=4, alpha=8, target_modules=targets)
    run, theirs, adapters = trained_adapter_export(model, cfg, lora, base, tmp_path)
    return run, theirs, adapters, base


def test_comfyuis_loader_maps_every_key_and_merges_to_vidforges_merged_weights(tmp_path) -> None:
    cfg = LTX2Model.model_validate(LTX20)
    torch.manual_seed(1)
    comfy = {
        f"diffusion_model.{k}": torch.randn_like(v) * 0.02 for k, v in ComfyLTXV(cfg).state_dict().items()
    }
    model = build_model(cfg, device="cpu")
    model.load_state_dict(to_diffusers(comfy), strict=True)  # the two layouts hold the same weights
    base = save_model(model, tmp_path / "base")
    lora = Lora(rank=4, alpha=8, target_modules=[t for t in TARGETS if t != "to_gate_logits"])
    run, theirs, adapters = trained_adapter_export(model, cfg, lora, base, tmp_path)

    patched, loaded = comfyui_apply(comfy, theirs)
    assert loaded == set(theirs)  # no key ComfyUI would warn "lora key not loaded" about
    assert sum(k.endswith(".lora_B.weight") for k in loaded) == adapters  # every trained layer landed
    assert all(v.item() == lora.alpha for k, v in theirs.items() if k.endswith(".alpha"))
    merged = merge(load_adapter(load_model(base), run / "export")).state_dict()
    as_diffusers, before = to_diffusers(patched), to_diffusers(comfy)
    assert set(as_diffusers) == set(merged)
    moved = 0
    for name, weight in merged.items():
        torch.testing.assert_close(as_diffusers[name], weight, rtol=1e-5, atol=1e-6, msg=name)
        moved += not torch.equal(weight, before[name])
    assert moved == adapters


@pytest.mark.parametrize("variant", [LTX20, LTX23], ids=["ltx2.0", "ltx2.3"])
def test_diffusers_converter_turns_the_comfyui_file_back_into_our_diffusers_lora(variant, tmp_path) -> None:
    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_ltx2_lora_to_diffusers

    run, theirs, adapters, _ = _adapter(LTX2Model.model_validate(variant), tmp_path)
    ours = load_file(run / "export" / WEIGHTS)
    back = _convert_non_diffusers_ltx2_lora_to_diffusers(dict(theirs))
    alphas = {k for k in back if k.endswith(".alpha")}
    assert len(alphas) == adapters and all(back[k].item() == 8 for k in alphas)
    assert set(back) - alphas == set(ours)
    for key, value in ours.items():
        assert torch.equal(back[key], value), key

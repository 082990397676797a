"""`vidforge model export RUN --to comfyui`: a LoRA run's adapter as the file ComfyUI loads. Held to
ComfyUI's own rules, restated here from its source (ComfyUI is not on PyPI): the parameter names of its
Wan model (`comfy/ldm/wan/model.py`), the keys its loader maps to them and how it applies a pair
(`tests/comfyui_fixtures.py`). The base weights are written under ComfyUI's names and brought to vidforge's by
diffusers' converter of the original Wan layout (`convert_wan_transformer_to_diffusers`), so the name map
under test is checked against two tables it shares nothing with."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from comfyui_fixtures import comfyui_apply  # noqa: E402
from train_fixtures import WAN, train_profile  # noqa: E402

from vidforge.cli.app import app  # noqa: E402
from vidforge.files import write_text  # noqa: E402
from vidforge.lora import apply_lora, load_adapter, merge, save_adapter  # noqa: E402
from vidforge.lora.comfyui import FILE  # noqa: E402
from vidforge.models import build_model  # noqa: E402
from vidforge.profile import dump_profile  # noqa: E402
from vidforge.profile.model import Model  # noqa: E402
from vidforge.profile.train import Lora  # noqa: E402
from vidforge.weights.checkpoint import load_model, save_model  # noqa: E402

# Every linear layer of the wan network: the adapter trains all of them, so every row of the table is used.
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_k_proj", "add_v_proj", "net.0.proj", "net.2"]
TARGETS += ["linear_1", "linear_2", "time_proj", "proj_out"]
FREQ_DIM = 256  # WanModel's freq_dim
CLIP_DIM = 1280  # MLPProj(1280, dim): ComfyUI's I2V image embedding takes CLIP ViT-H's width


# ComfyUI's Wan model, its parameters only (names and shapes), as comfy/ldm/wan/model.py builds them.
class ComfyAttention(nn.Module):  # WanSelfAttention / WanT2VCrossAttention / WanI2VCrossAttention
    def __init__(self, dim: int, image: bool) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q, self.norm_k = nn.RMSNorm(dim), nn.RMSNorm(dim)
        if image:
            self.k_img, self.v_img, self.norm_k_img = (
                nn.Linear(dim, dim),
                nn.Linear(dim, dim),
                nn.RMSNorm(dim),
            )


class ComfyBlock(nn.Module):  # WanAttentionBlock with cross_attn_norm=True; norm1 and norm2 hold nothing
    def __init__(self, dim: int, ffn: int, image: bool) -> None:
        super().__init__()
        self.self_attn = ComfyAttention(dim, image=False)
        self.norm3 = nn.LayerNorm(dim)
        self.cross_attn = ComfyAttention(dim, image)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))
        self.modulation = nn.Parameter(torch.empty(1, 6, dim))


class ComfyHead(nn.Module):  # Head
    def __init__(self, dim: int, out: int) -> None:
        super().__init__()
        self.head = nn.Linear(dim, out)
        self.modulation = nn.Parameter(torch.empty(1, 2, dim))


class ComfyWan(nn.Module):  # WanModel(model_type="t2v" | "i2v")
    def __init__(self, cfg: Model) -> None:
        super().__init__()
        dim, image = cfg.hidden, cfg.image_dim > 0
        self.patch_embedding = nn.Conv3d(cfg.in_channels + cfg.condition_channels, dim, cfg.patch, cfg.patch)
        self.text_embedding = nn.Sequential(nn.Linear(cfg.text_dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.time_embedding = nn.Sequential(nn.Linear(FREQ_DIM, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList(ComfyBlock(dim, cfg.mlp_hidden, image) for _ in range(cfg.layers))
        self.head = ComfyHead(dim, math.prod(cfg.patch) * cfg.in_channels)
        if image:  # MLPProj: LayerNorm, Linear, GELU, Linear, LayerNorm
            self.img_emb = nn.Module()
            self.img_emb.proj = nn.Sequential(
                nn.LayerNorm(CLIP_DIM), nn.Linear(CLIP_DIM, CLIP_DIM), nn.GELU(), nn.Linear(CLIP_DIM, dim),
                nn.LayerNorm(dim),
            )  # fmt: skip


def to_diffusers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    return convert_wan_transformer_to_diffusers(
        {k.removeprefix("diffusion_model."): v for k, v in state.items()}
    )


def wan_config(image: bool) -> Model:
    """Wan2.1's channels and text width (I2V: 16 + 20 condition channels, CLIP's 1280), at a small width."""
    image_fields = {"condition_channels": 20, "image_dim": CLIP_DIM} if image else {}
    return Model.model_validate(
        {
            "preset": None, "family": "wan", "layers": 2, "hidden": 128, "heads": 2, "mlp_hidden": 256,
            "in_channels": 16, "text_dim": 4096, "cross_attn_norm": True, **image_fields,
        }
    )  # fmt: skip


def test_comfyuis_loader_maps_every_key_and_merges_to_vidforges_merged_weights(tmp_path) -> None:
    # Wan2.1-I2V's layers are T2V's and the image embedding's: one model holds every row of the table
    cfg = wan_config(image=True)
    torch.manual_seed(0)
    comfy = {
        f"diffusion_model.{k}": torch.randn_like(v) * 0.02 for k, v in ComfyWan(cfg).state_dict().items()
    }
    model = build_model(cfg, device="cpu")
    model.load_state_dict(to_diffusers(comfy), strict=True)  # the two layouts hold the same weights
    base = save_model(model, tmp_path / "base")

    lora = Lora(rank=4, alpha=8, target_modules=TARGETS)
    apply_lora(model, lora, torch.float32)
    with torch.no_grad():  # a trained adapter: lora_B moved off its zeros
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    adapters = sum(".lora_B." in n for n, _ in model.named_parameters())
    run = save_adapter(tmp_path / "run" / "export", model.state_dict(), cfg, lora, 1, str(base)).parent

    out = tmp_path / "comfyui"
    result = CliRunner().invoke(app, ["model", "export", str(run), "--to", "comfyui", "-o", str(out)])
    assert result.exit_code == 0, result.output
    theirs = load_file(out / FILE)

    patched, loaded = comfyui_apply(comfy, theirs)
    assert loaded == set(theirs)  # no key ComfyUI would warn "lora key not loaded" about
    assert sum(k.endswith(".lora_B.weight") for k in loaded) == adapters  # every trained layer landed
    for key, value in theirs.items():
        if key.endswith(".alpha"):
            assert value.item() == lora.alpha
        if key.endswith(".lora_A.weight"):
            assert value.shape[0] == lora.rank

    merged = merge(load_adapter(load_model(base), run / "export")).state_dict()
    as_diffusers, before = to_diffusers(patched), to_diffusers(comfy)
    assert set(as_diffusers) == set(merged)
    moved = 0
    for name, weight in merged.items():
        torch.testing.assert_close(as_diffusers[name], weight, rtol=1e-5, atol=1e-6, msg=name)
        moved += not torch.equal(weight, before[name])
    assert moved == adapters


def test_a_family_comfyui_has_no_model_of_and_merged_are_refused_in_one_line(tmp_path) -> None:
    cfg = Model.model_validate({"preset": "tiny"})
    model = build_model(cfg, device="cpu")
    lora = Lora(rank=2, alpha=2)
    apply_lora(model, lora, torch.float32)
    run = save_adapter(tmp_path / "run" / "export", model.state_dict(), cfg, lora, 1, None).parent
    for extra, words in (([], "ComfyUI has no model of the vidforge family"), (["--merged"], "--to comfyui")):
        args = ["model", "export", str(run), "--to", "comfyui", *extra, "-o", str(tmp_path / "out")]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        (line,) = result.stderr.strip().splitlines()
        assert words in line
    assert not (tmp_path / "out").exists()


def test_an_adapter_trained_to_predict_clean_latents_is_refused_in_one_line(tmp_path) -> None:
    """ComfyUI's Wan samplers read the network's output as a velocity."""
    profile = train_profile(*WAN, "diffusion.flow_prediction=clean")
    model = build_model(profile.model, device="cpu")
    lora = Lora(rank=2, alpha=2)
    apply_lora(model, lora, torch.float32)
    export = save_adapter(tmp_path / "run" / "export", model.state_dict(), profile.model, lora, 1, None)
    write_text(export / "profile.yaml", dump_profile(profile))
    args = ["model", "export", str(export.parent), "--to", "comfyui", "-o", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "flow_prediction=clean" in line and "ComfyUI" in line
    assert not (tmp_path / "out").exists()

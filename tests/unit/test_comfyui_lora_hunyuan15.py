"""`vidforge model export RUN --to comfyui` of a HunyuanVideo-1.5 LoRA, held to ComfyUI's rules
(`tests/comfyui_fixtures.py`) on its HunyuanVideo-1.5 model, restated here from its source: the parameters
of `comfy/ldm/hunyuan_video/model.py`'s `HunyuanVideo` with the 1.5 modules (`vision_in`, `byt5_in`,
`cond_type_embedding`), its double blocks `comfy/ldm/flux/layers.py`'s `DoubleStreamBlock` (one `qkv`
projection each), and how its loader brings the release's checkpoint to those names
(`comfy/supported_models.py`, `HunyuanVideo.process_unet_state_dict`'s renames, and the 1.5 release's
separate q, k, v stacked into that qkv). The release's names are tied to vidforge's (diffusers') by diffusers'
own converter of the release (`scripts/convert_hunyuan_video1_5_to_diffusers.py`,
`convert_hyvideo15_transformer_to_diffusers`, restated as its table): two tables the name map under test
shares nothing with. diffusers 0.42 has no loader of HunyuanVideo-1.5 LoRAs in the release's names to
convert the file back with."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from comfyui_fixtures import comfyui_apply, trained_adapter_export  # noqa: E402
from hunyuan15_fixtures import our_config, reference_transformer  # noqa: E402

from vidforge.lora import load_adapter, merge  # noqa: E402
from vidforge.models import build_model  # noqa: E402
from vidforge.profile.train import Lora  # noqa: E402
from vidforge.weights.checkpoint import load_model, save_model  # noqa: E402

# Every linear layer of the network (x_embedder.proj is a Conv3d): every row of the tables is used.
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]
TARGETS += ["linear", "net.0.proj", "net.2", "linear_1", "linear_2", "linear_3", "proj_in", "proj_out"]
BYT5_WIDTH = 2048  # ByT5Mapper(in_dim=1472, out_dim=2048, hidden_dim=2048, out_dim1=hidden)


# ComfyUI's HunyuanVideo-1.5 model, its parameters only (names and shapes).
def linear_pair(first: int, second: int, out: int) -> nn.Sequential:  # Linear, activation, Linear
    return nn.Sequential(nn.Linear(first, second), nn.SiLU(), nn.Linear(second, out))


class MLPEmbedder(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.in_layer, self.out_layer = nn.Linear(dim, hidden), nn.Linear(hidden, hidden)


class SelfAttention(nn.Module):  # flux layers' SelfAttention: qkv, QKNorm, proj
    def __init__(self, dim: int, head_dim: int) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm = nn.Module()
        self.norm.query_norm, self.norm.key_norm = nn.Module(), nn.Module()
        self.norm.query_norm.scale = nn.Parameter(torch.empty(head_dim))
        self.norm.key_norm.scale = nn.Parameter(torch.empty(head_dim))


class DoubleStreamBlock(nn.Module):  # its norm1/norm2 are LayerNorms without parameters
    def __init__(self, dim: int, head_dim: int, mlp: int) -> None:
        super().__init__()
        for stream in ("img", "txt"):
            mod = nn.Module()
            mod.lin = nn.Linear(dim, 6 * dim)  # Modulation(double=True)
            setattr(self, f"{stream}_mod", mod)
            setattr(self, f"{stream}_attn", SelfAttention(dim, head_dim))
            setattr(self, f"{stream}_mlp", linear_pair(dim, mlp, dim))


class TokenRefinerBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.self_attn = nn.Module()  # SelfAttentionRef
        self.self_attn.qkv, self.self_attn.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = linear_pair(dim, 4 * dim, dim)


class ComfyHunyuanVideo15(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        dim, head_dim = cfg.hidden, cfg.hidden // cfg.heads
        self.img_in = nn.Module()  # PatchEmbed(conv3d=True)
        self.img_in.proj = nn.Conv3d(cfg.in_channels + cfg.condition_channels, dim, cfg.patch, cfg.patch)
        self.time_in = MLPEmbedder(256, dim)
        self.txt_in = nn.Module()  # TokenRefiner
        self.txt_in.input_embedder = nn.Linear(cfg.text_dim, dim)
        self.txt_in.t_embedder, self.txt_in.c_embedder = MLPEmbedder(256, dim), MLPEmbedder(cfg.text_dim, dim)
        self.txt_in.individual_token_refiner = nn.Module()
        self.txt_in.individual_token_refiner.blocks = nn.ModuleList(
            TokenRefinerBlock(dim) for _ in range(cfg.refiner_layers)
        )
        self.double_blocks = nn.ModuleList(
            DoubleStreamBlock(dim, head_dim, cfg.mlp_hidden) for _ in range(cfg.layers)
        )
        self.byt5_in = nn.Module()
        self.byt5_in.layernorm = nn.LayerNorm(cfg.text_2_dim)
        self.byt5_in.fc1, self.byt5_in.fc2 = (
            nn.Linear(cfg.text_2_dim, BYT5_WIDTH),
            nn.Linear(BYT5_WIDTH, BYT5_WIDTH),
        )
        self.byt5_in.fc3 = nn.Linear(BYT5_WIDTH, dim)
        self.final_layer = nn.Module()  # LastLayer(hidden, patch_size[-1], out_channels)
        self.final_layer.linear = nn.Linear(dim, cfg.patch[-1] ** 2 * cfg.in_channels)
        self.final_layer.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.vision_in = nn.Module()  # comfy/ldm/wan/model.py's MLPProj
        self.vision_in.proj = nn.Sequential(
            nn.LayerNorm(cfg.image_dim), nn.Linear(cfg.image_dim, cfg.image_dim), nn.GELU(),
            nn.Linear(cfg.image_dim, dim), nn.LayerNorm(dim),
        )  # fmt: skip
        self.cond_type_embedding = nn.Embedding(3, dim)


# comfy/supported_models.py, HunyuanVideo.process_unet_state_dict: its renames, in its order.
COMFY_RENAMES = (
    ("txt_in.t_embedder.mlp.0.", "txt_in.t_embedder.in_layer."),
    ("txt_in.t_embedder.mlp.2.", "txt_in.t_embedder.out_layer."),
    ("txt_in.c_embedder.linear_1.", "txt_in.c_embedder.in_layer."),
    ("txt_in.c_embedder.linear_2.", "txt_in.c_embedder.out_layer."),
    ("_mod.linear.", "_mod.lin."),
    ("_attn_qkv.", "_attn.qkv."),
    ("mlp.fc1.", "mlp.0."),
    ("mlp.fc2.", "mlp.2."),
    ("_attn_q_norm.weight", "_attn.norm.query_norm.scale"),
    ("_attn_k_norm.weight", "_attn.norm.key_norm.scale"),
    (".q_norm.weight", ".norm.query_norm.scale"),
    (".k_norm.weight", ".norm.key_norm.scale"),
    ("_attn_proj.", "_attn.proj."),
    (".modulation.linear.", ".modulation.lin."),
    ("_in.mlp.2.", "_in.out_layer."),
    ("_in.mlp.0.", "_in.in_layer."),
)
_SEPARATE_QKV = re.compile(r"(double_blocks\.\d+\.(?:img|txt)_attn)_([qkv])\.(weight|bias)")


def comfyui_from_release(release: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The release's checkpoint as ComfyUI's model holds it: renamed, and each double block's separate q, k,
    v stacked into the one qkv its block splits in that order."""
    out, qkv = {}, {}
    for key, value in release.items():
        separate = _SEPARATE_QKV.fullmatch(key)
        if separate is not None:
            qkv.setdefault(f"{separate.group(1)}.qkv.{separate.group(3)}", {})[separate.group(2)] = value
            continue
        for old, new in COMFY_RENAMES:
            key = key.replace(old, new)
        out[key] = value
    out |= {key: torch.cat([parts["q"], parts["k"], parts["v"]]) for key, parts in qkv.items()}
    return {f"diffusion_model.{k}": v for k, v in out.items()}


# diffusers' convert_hyvideo15_transformer_to_diffusers as its table: the release's name -> diffusers'.
SCRIPT_TOP = {
    "time_in.mlp.0": "time_embed.timestep_embedder.linear_1",
    "time_in.mlp.2": "time_embed.timestep_embedder.linear_2",
    "txt_in.t_embedder.mlp.0": "context_embedder.time_text_embed.timestep_embedder.linear_1",
    "txt_in.t_embedder.mlp.2": "context_embedder.time_text_embed.timestep_embedder.linear_2",
    "txt_in.c_embedder.linear_1": "context_embedder.time_text_embed.text_embedder.linear_1",
    "txt_in.c_embedder.linear_2": "context_embedder.time_text_embed.text_embedder.linear_2",
    "txt_in.input_embedder": "context_embedder.proj_in",
    "byt5_in.layernorm": "context_embedder_2.norm",
    "byt5_in.fc1": "context_embedder_2.linear_1",
    "byt5_in.fc2": "context_embedder_2.linear_2",
    "byt5_in.fc3": "context_embedder_2.linear_3",
    "vision_in.proj.0": "image_embedder.norm_in",
    "vision_in.proj.1": "image_embedder.linear_1",
    "vision_in.proj.3": "image_embedder.linear_2",
    "vision_in.proj.4": "image_embedder.norm_out",
    "img_in.proj": "x_embedder.proj",
    "cond_type_embedding": "cond_type_embed",
    "final_layer.adaLN_modulation.1": "norm_out.linear",  # (shift, scale) -> (scale, shift)
    "final_layer.linear": "proj_out",
}
SCRIPT_REFINER = {  # txt_in.individual_token_refiner.blocks.N. -> context_embedder.token_refiner.refiner_blocks.N.
    "norm1": "norm1", "norm2": "norm2", "self_attn_proj": "attn.to_out.0", "mlp.fc1": "ff.net.0.proj",
    "mlp.fc2": "ff.net.2", "adaLN_modulation.1": "norm_out.linear",
    "self_attn_qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),  # chunked in three
}  # fmt: skip
SCRIPT_BLOCK = {  # double_blocks.N. -> transformer_blocks.N.
    "img_mod.linear": "norm1.linear", "txt_mod.linear": "norm1_context.linear", "img_attn_q": "attn.to_q",
    "img_attn_k": "attn.to_k", "img_attn_v": "attn.to_v", "img_attn_q_norm": "attn.norm_q",
    "img_attn_k_norm": "attn.norm_k", "img_attn_proj": "attn.to_out.0", "txt_attn_q": "attn.add_q_proj",
    "txt_attn_k": "attn.add_k_proj", "txt_attn_v": "attn.add_v_proj", "txt_attn_q_norm": "attn.norm_added_q",
    "txt_attn_k_norm": "attn.norm_added_k", "txt_attn_proj": "attn.to_add_out", "img_mlp.fc1": "ff.net.0.proj",
    "img_mlp.fc2": "ff.net.2", "txt_mlp.fc1": "ff_context.net.0.proj", "txt_mlp.fc2": "ff_context.net.2",
}  # fmt: skip


def _release_names() -> dict[str, str | tuple[str, ...]]:
    """diffusers' name (a module, no .weight) -> the release's, from the script's tables (blocks by regex)."""
    names = {theirs: ours for ours, theirs in SCRIPT_TOP.items()}
    for table, ours, theirs in (
        (SCRIPT_REFINER, "txt_in.individual_token_refiner.blocks.{}.", "context_embedder.token_refiner.refiner_blocks.{}."),
        (SCRIPT_BLOCK, "double_blocks.{}.", "transformer_blocks.{}."),
    ):  # fmt: skip
        for release, diffusers in table.items():
            for i, d in enumerate(diffusers if isinstance(diffusers, tuple) else (diffusers,)):
                names[theirs + d] = (ours + release, i) if isinstance(diffusers, tuple) else ours + release
    return names


def release_from_diffusers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' state dict in the release's names: the script read backwards (its chunks stacked, the
    output norm's halves swapped back)."""
    names, out, chunks = _release_names(), {}, {}
    for key, value in state.items():
        module, _, kind = key.rpartition(".")
        block = re.fullmatch(
            r"(transformer_blocks|context_embedder\.token_refiner\.refiner_blocks)\.(\d+)\.(.+)", module
        )
        pattern = f"{block.group(1)}.{{}}.{block.group(3)}" if block else module
        release = names[pattern]
        if isinstance(release, tuple):
            chunks.setdefault(f"{release[0].format(block.group(2))}.{kind}", {})[release[1]] = value
            continue
        release = release.format(block.group(2)) if block else release
        out[f"{release}.{kind}"] = torch.cat(value.chunk(2)[::-1]) if module == "norm_out.linear" else value
    out |= {key: torch.cat([parts[i] for i in range(3)]) for key, parts in chunks.items()}
    return out


def test_comfyuis_loader_maps_every_key_and_merges_to_vidforges_merged_weights(tmp_path) -> None:
    cfg = our_config(reference_transformer())
    torch.manual_seed(0)
    model = build_model(cfg, device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.02)
    base = save_model(model, tmp_path / "base")
    comfy = comfyui_from_release(release_from_diffusers(model.state_dict()))
    theirs_shapes = {
        f"diffusion_model.{k}": v.shape for k, v in ComfyHunyuanVideo15(cfg).state_dict().items()
    }
    assert {k: v.shape for k, v in comfy.items()} == theirs_shapes  # the two tables and ComfyUI's model agree

    lora = Lora(rank=4, alpha=8, target_modules=TARGETS)
    run, theirs, adapters = trained_adapter_export(model, cfg, lora, base, tmp_path)
    patched, loaded = comfyui_apply(comfy, theirs)
    assert loaded == set(theirs)  # no key ComfyUI would warn "lora key not loaded" about
    fused = sum(k.endswith("qkv.lora_B.weight") for k in theirs)
    assert fused == 2 * cfg.layers + cfg.refiner_layers
    assert sum(k.endswith(".lora_B.weight") for k in loaded) == adapters - 2 * fused  # q, k, v: one pair
    for key, value in theirs.items():
        rank = theirs[key.replace(".alpha", ".lora_A.weight")].shape[0] if key.endswith(".alpha") else None
        if rank is not None:  # alpha / rank is the adapter's, whatever the fused pair's rank
            assert value.item() / rank == lora.alpha / lora.rank

    merged = merge(load_adapter(load_model(base), run / "export")).state_dict()
    expected = comfyui_from_release(release_from_diffusers(merged))
    moved = 0
    for name, weight in expected.items():
        torch.testing.assert_close(patched[name], weight, rtol=1e-5, atol=1e-6, msg=name)
        moved += not torch.equal(weight, comfy[name])
    assert moved == adapters - 2 * fused

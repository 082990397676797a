"""The ltx2 family registered: a published LTX-2 folder goes through vidforge's one weights-folder resolver
(`model import`'s path) to the profile that trains and samples it as published, an export with its
profile.yaml, and back to a folder diffusers loads with every tensor bitwise (the audio stream's too); the
preset validates as a profile of the published size; the CLI commands that read a folder take it; and what
the network refuses at its first forward is refused when the profile loads."""

import json

import pytest
import torch
from diffusers import LTX2VideoTransformer3DModel
from safetensors import safe_open
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.errors import UserInputError
from vidforge.families import family
from vidforge.families.ltx2 import PRESETS
from vidforge.families.ltx2.model import LTX2Model
from vidforge.families.ltx2.network import LTX2Transformer
from vidforge.families.plain_batches import PLAIN_BATCHES
from vidforge.models import build_model, count_parameters
from vidforge.profile import load_profile
from vidforge.profile.loading import apply_override, apply_overrides, validate_profile
from vidforge.weights.weights_folder import (
    export_model,
    export_published,
    find_weights,
    import_published,
    load_published,
    published_profile,
)


@pytest.fixture(scope="module")
def folder(ltx2_folder):
    return ltx2_folder()


def _tensors(path):
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_model_import_and_export_through_the_resolver(folder, tmp_path):
    published = find_weights(folder).published
    assert published.family == "ltx2" and published.objective == "flow"
    profile = published_profile(published)
    assert isinstance(profile.model, LTX2Model) and profile.model.rope_type == "split"
    assert (profile.diffusion.objective, profile.diffusion.flow_prediction) == ("flow", "velocity")
    assert (profile.data.packing, profile.diffusion.caption_dropout, profile.infer.fps) == (False, 0, 24)
    assert isinstance(build_model(profile.model, device="meta"), LTX2Transformer)

    export = import_published(published, tmp_path / "export", profile)
    assert export_model(export) == profile.model
    assert load_profile(export / "profile.yaml").model == profile.model
    out = export_published(export, tmp_path / "diffusers", max_shard_bytes=2**30)
    back = LTX2VideoTransformer3DModel.from_pretrained(out)
    original = _tensors(folder / "transformer" / "diffusion_pytorch_model.safetensors")
    assert set(back.state_dict()) == set(original)
    for name, tensor in back.state_dict().items():
        assert torch.equal(tensor.view(torch.uint8), original[name].view(torch.uint8)), name
    # sharded: the same tensors over several files with diffusers' index
    shards = export_published(export, tmp_path / "shards", max_shard_bytes=2**14)
    assert (shards / "diffusion_pytorch_model.safetensors.index.json").is_file()
    sharded = LTX2VideoTransformer3DModel.from_pretrained(shards).state_dict()
    assert all(torch.equal(sharded[k], v) for k, v in back.state_dict().items())

    # read without importing: the video path's tensors, with the profile's attention kernel
    runtime = profile.model.model_copy(update={"attention": "dense"})
    network = load_published(published, runtime=runtime)
    assert network.config.attention == "dense"
    assert set(network.state_dict()) <= set(original)
    assert all(torch.equal(v, original[k]) for k, v in network.state_dict().items())


def test_the_preset_is_a_profile_of_the_published_size():
    for name in PRESETS:
        data: dict = {"model": {"preset": name}}
        apply_overrides(data, family("ltx2").profile_defaults)
        model = validate_profile(data, name).model
        assert isinstance(model, LTX2Model) and model.family == "ltx2"
        with torch.device("meta"):
            built = sum(p.numel() for p in LTX2Transformer(model).parameters())
        assert count_parameters(model) == built
    assert 12.9e9 < built < 13.2e9  # LTX-2's video stream without its audio cross-attention
    assert family("ltx2").lora_targets


@pytest.mark.parametrize(
    "setting, says",
    [
        ("data.packing=true", "data.packing: model.family=ltx2 runs plain batches only"),
        ("diffusion.caption_dropout=0.1", "diffusion.caption_dropout: LTX-2 trains its unconditional"),
        ("model.audio=true", "model.audio: LTX-2's audio stream is not built yet"),
    ],
)
def test_what_the_network_refuses_is_refused_at_load_in_one_line(setting, says):
    data: dict = {"model": {"preset": "ltx-2"}, "cluster": {"gpus_per_node": 2}}
    apply_overrides(data, PLAIN_BATCHES)
    apply_override(data, setting)
    with pytest.raises(UserInputError) as err:
        validate_profile(data, "profile")
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_cli_reads_the_folder(folder, tmp_path):
    """`model import` writes an export whose profile `train --dry-run` lays out, and `bench plan --model`
    plans the folder and the preset."""
    runner = CliRunner()
    result = runner.invoke(app, ["model", "import", str(folder), "-o", str(tmp_path / "imported")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "imported" / "config.json").read_text())["model"]["family"] == "ltx2"
    profile = str(tmp_path / "imported" / "profile.yaml")
    result = runner.invoke(app, ["--json", "train", "--dry-run", "--profile", profile])
    assert result.exit_code == 0, result.output
    argv = ["--json", "bench", "plan", "--profile", "dit1b_1xh200", "--gpus", "1", "--model"]
    result = runner.invoke(app, [*argv, str(folder)])
    assert result.exit_code == 0, result.output
    assert '"tokens_per_step"' in result.output
    # the published size on one H200 without checkpointing: planned (the module's parameter count) and
    # refused in one line, as any model that does not fit
    result = runner.invoke(app, [*argv, "ltx-2"])
    assert result.exit_code == 2 and "13,041,520,768 params" in result.output, result.output
    assert "per rank" in json.loads(result.output.strip().splitlines()[-1])["message"]


def test_init_weights_draws_as_diffusers_initialises():
    """A network built on the meta device, materialised and `init_weights`-ed, against diffusers' fresh
    LTX2VideoTransformer3DModel of the same config (LTX-2.3's prompt modulation on): the same video tensors,
    the norms at one, every Linear within PyTorch's fan-in bound, the tables at diffusers' spread."""
    torch.manual_seed(0)
    ref = LTX2VideoTransformer3DModel(
        in_channels=8, out_channels=8, num_attention_heads=4, attention_head_dim=64, cross_attention_dim=256,
        caption_channels=32, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=1, cross_attn_mod=True,
        audio_cross_attn_mod=True,
    ).state_dict()  # fmt: skip
    model = LTX2Model(layers=1, hidden=256, heads=4, in_channels=8, text_dim=32, prompt_modulation=True)
    with torch.device("meta"):
        network = LTX2Transformer(model)
    network.to_empty(device="cpu")
    network.init_weights()
    ours = network.state_dict()
    assert {k: v.shape for k, v in ours.items()} == {k: ref[k].shape for k in ours}
    modules = dict(network.named_modules())
    for name, tensor in ours.items():
        owner = modules[name.rpartition(".")[0]]
        if isinstance(owner, torch.nn.RMSNorm):
            assert torch.equal(tensor, torch.ones_like(tensor)) and torch.equal(ref[name], tensor), name
        elif isinstance(owner, torch.nn.Linear):
            bound = owner.in_features**-0.5
            assert tensor.abs().max() <= bound and ref[name].abs().max() <= bound, name
            assert tensor.std() > bound / 3, name  # drawn, not left at what to_empty held
        else:  # the modulation tables
            assert abs(tensor.std() / ref[name].std() - 1) < 0.15, name

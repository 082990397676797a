"""The hunyuan15 family registered: a published folder goes through vidforge's one weights-folder
resolver (`model import`'s path) to the profile that trains and samples it as published, an export with
its profile.yaml, and back to a folder diffusers loads with every tensor bitwise; the presets validate as
profiles and build the published size."""

import pytest
import torch
from diffusers import HunyuanVideo15Transformer3DModel
from hunyuan15_fixtures import FLOW_SHIFT, GUIDANCE
from safetensors import safe_open

from vidforge.families import family
from vidforge.families.hunyuan15 import PRESETS
from vidforge.families.hunyuan15.model import HunyuanVideo15Model
from vidforge.families.hunyuan15.network import HunyuanVideo15Transformer
from vidforge.models import build_model, count_parameters
from vidforge.profile import load_profile
from vidforge.profile.loading import ProfileError, apply_overrides, validate_profile
from vidforge.weights.weights_folder import (
    export_model,
    export_published,
    find_weights,
    import_published,
    published_profile,
)


@pytest.mark.parametrize("task", ["t2v", "i2v"])
def test_model_import_and_export_through_the_resolver(task, tmp_path, hunyuan15_folder):
    root = hunyuan15_folder(task)
    published = find_weights(root).published
    assert published.family == "hunyuan15" and published.objective == "flow"
    profile = published_profile(published)
    assert isinstance(profile.model, HunyuanVideo15Model) and profile.model.task == task
    assert (profile.diffusion.objective, profile.diffusion.flow_prediction) == ("flow", "velocity")
    assert (profile.diffusion.flow_shift, profile.diffusion.guidance) == (FLOW_SHIFT, GUIDANCE)
    assert profile.infer.fps == 24
    assert isinstance(build_model(profile.model, device="meta"), HunyuanVideo15Transformer)

    export = import_published(published, tmp_path / "export", profile)
    assert export_model(export) == profile.model
    assert load_profile(export / "profile.yaml").model == profile.model
    out = export_published(export, tmp_path / "diffusers", max_shard_bytes=2**30)
    back = HunyuanVideo15Transformer3DModel.from_pretrained(out)
    with safe_open(str(root / "transformer" / "diffusion_pytorch_model.safetensors"), framework="pt") as f:
        original = {k: f.get_tensor(k) for k in f.keys()}
    assert set(back.state_dict()) == set(original)
    for name, tensor in back.state_dict().items():
        assert torch.equal(tensor.view(torch.uint8), original[name].view(torch.uint8)), name


def test_presets_are_profiles_of_the_published_size():
    for name in PRESETS:
        data: dict = {"model": {"preset": name}}
        apply_overrides(
            data, family("hunyuan15").profile_defaults
        )  # what every profile of the family carries
        model = validate_profile(data, name).model
        assert isinstance(model, HunyuanVideo15Model) and model.family == "hunyuan15"
    assert 8.2e9 < count_parameters(model) < 8.4e9
    assert family("hunyuan15").lora_targets
    with pytest.raises(ProfileError, match="data.packing: model.family=hunyuan15 runs plain batches only"):
        validate_profile({"model": {"preset": name}, "diffusion": {"objective": "flow"}}, name)

"""A HunyuanVideo-1.5 folder in the published layout (tiny random components of the real classes, saved by
the pipelines' own save_pretrained) read into the family's facts, each held to what diffusers' loaded
pipeline says; weight import then export gives every tensor back bitwise and a folder diffusers loads;
the presets are the published shape; LoRA's targets name the same modules in both networks."""

import inspect

import pytest
import torch
from diffusers import (
    HunyuanVideo15ImageToVideoPipeline,
    HunyuanVideo15Pipeline,
    HunyuanVideo15Transformer3DModel,
)
from hunyuan15_fixtures import FLOW_SHIFT, GUIDANCE, SCALING, our_config
from safetensors import safe_open

from vidforge.errors import UserInputError
from vidforge.families.hunyuan15 import LORA_TARGETS, PRESETS
from vidforge.families.hunyuan15.model import HunyuanVideo15Model
from vidforge.families.hunyuan15.network import HunyuanVideo15Transformer
from vidforge.families.hunyuan15.published import read_pipeline
from vidforge.families.hunyuan15.weights import export_weights, load_published, write_export

PIPELINES = {"t2v": HunyuanVideo15Pipeline, "i2v": HunyuanVideo15ImageToVideoPipeline}


@pytest.fixture(scope="module", params=["t2v", "i2v"])
def folder(request, hunyuan15_folder):
    task = request.param
    root = hunyuan15_folder(task)
    return task, root, PIPELINES[task].from_pretrained(root)


def test_published_facts_are_the_pipelines(folder):
    task, root, pipe = folder
    facts = read_pipeline(root)
    assert HunyuanVideo15Model(**facts.model) == our_config(pipe.transformer).model_copy(
        update={"text_2_tokens": pipe.tokenizer_2_max_length}
    )
    assert facts.model["task"] == task
    assert facts.flow_shift == pipe.scheduler.config.shift == FLOW_SHIFT
    assert facts.guidance == pipe.guider.guidance_scale == GUIDANCE
    assert (facts.spatial_compression, facts.temporal_compression) == (
        pipe.vae_scale_factor_spatial,
        pipe.vae_scale_factor_temporal,
    )
    assert facts.latent_scale == pipe.vae.config.scaling_factor == SCALING
    assert facts.mllm.path == (root / "text_encoder").resolve()
    assert facts.mllm.preprocessor == (root / "tokenizer").resolve()
    assert (facts.mllm.tokens, facts.mllm_crop) == (
        pipe.tokenizer_max_length,
        pipe.prompt_template_encode_start_idx,
    )
    assert (facts.glyph.path, facts.glyph.tokens) == (
        (root / "text_encoder_2").resolve(),
        pipe.tokenizer_2_max_length,
    )
    if task == "i2v":
        assert facts.image.path == (root / "image_encoder").resolve()
        assert facts.image.tokens == pipe.vision_num_semantic_tokens
    else:
        assert facts.image is None
    defaults = inspect.signature(type(pipe).__call__).parameters
    assert (facts.frames, facts.steps) == (
        defaults["num_frames"].default,
        defaults["num_inference_steps"].default,
    )
    assert defaults["negative_prompt"].default is None and facts.negative_prompt == ""
    ratio = (16, 9)  # the text-to-video pipeline's default_aspect_ratio; image-to-video: a 16:9 image's
    assert getattr(pipe, "default_aspect_ratio", ratio) == ratio
    assert facts.default_size == tuple(
        pipe.video_processor.calculate_default_height_width(ratio[1], ratio[0], pipe.target_size)
    )


@pytest.mark.parametrize("target_size", [640, 960])
def test_preset_resolutions_are_the_pipelines(target_size):
    """480p and 720p: the pipeline's default size for its target_size, over the published 16x VAE."""
    from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

    from vidforge.families.hunyuan15.model import default_size

    processor = HunyuanVideo15ImageProcessor(vae_scale_factor=16)
    for aspect in [(16, 9), (9, 16), (1, 1), (4, 3)]:
        assert default_size(target_size, aspect) == tuple(
            processor.calculate_default_height_width(aspect[1], aspect[0], target_size)
        )
    assert default_size(target_size) == {640: (480, 848), 960: (720, 1280)}[target_size]


def test_import_then_export_is_bitwise_and_loads_in_diffusers(folder, tmp_path):
    task, root, pipe = folder
    model = write_export(root, tmp_path / "export")
    assert model.task == task
    out = export_weights(tmp_path / "export", tmp_path / "diffusers", max_shard_bytes=40_000)
    assert (out / "diffusion_pytorch_model.safetensors.index.json").is_file()  # sharded
    original = {}
    with safe_open(str(root / "transformer" / "diffusion_pytorch_model.safetensors"), framework="pt") as f:
        original = {k: f.get_tensor(k) for k in f.keys()}
    back = HunyuanVideo15Transformer3DModel.from_pretrained(out)
    assert back.config.task_type == task
    for name, tensor in back.state_dict().items():
        assert tensor.dtype == original[name].dtype
        assert torch.equal(tensor.view(torch.uint8), original[name].view(torch.uint8)), name
    assert set(back.state_dict()) == set(original)


def test_import_casts_on_request(folder, tmp_path):
    _, root, _ = folder
    write_export(root, tmp_path, dtype="bfloat16")
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    with pytest.raises(UserInputError, match="--dtype"):
        write_export(root, tmp_path, dtype="int8")


def test_loaded_without_import_equals_diffusers(folder):
    from hunyuan15_fixtures import caption, inputs, reference_out

    task, root, pipe = folder
    network = load_published(root, dtype=torch.float64).eval()
    ref = pipe.transformer.double().eval()
    inp = inputs(image=task == "i2v", glyphs=pipe.tokenizer_2_max_length)  # the folder's caption layout
    text, mask = caption(inp)
    with torch.no_grad():
        got = network(inp["x"], inp["t"], text, mask, condition=inp["condition"], image=inp["image"])
    torch.testing.assert_close(got, reference_out(ref, inp), rtol=1e-10, atol=1e-10)


def test_meanflow_and_foreign_configs_are_refused(tmp_path):
    import json

    from vidforge.families.hunyuan15.published import model_fields

    with pytest.raises(UserInputError, match="use_meanflow"):
        model_fields({"_class_name": "HunyuanVideo15Transformer3DModel", "use_meanflow": True}, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "WanTransformer3DModel"}))
    assert read_pipeline(tmp_path) is None


@pytest.mark.parametrize("name", ["hunyuanvideo1.5-480p-t2v", "hunyuanvideo1.5-720p-i2v"])
def test_presets_are_the_published_shape(name):
    """diffusers' defaults are the published transformer's config; the preset builds the same names and
    shapes (on the meta device), 8.3e9 parameters; every preset is this shape at its resolution and task."""
    cfg = HunyuanVideo15Model(**PRESETS[name])
    assert all(
        {**p, "task": 0, "target_size": 0} == {**PRESETS[name], "task": 0, "target_size": 0}
        for p in PRESETS.values()
    )
    with torch.device("meta"):
        ours = HunyuanVideo15Transformer(cfg).state_dict()
        ref = HunyuanVideo15Transformer3DModel(task_type=cfg.task, target_size=cfg.target_size)
    assert {k: tuple(v.shape) for k, v in ours.items()} == {
        k: tuple(v.shape) for k, v in ref.state_dict().items()
    }
    assert 8.2e9 < sum(v.numel() for v in ours.values()) < 8.4e9


def test_lora_targets_adapt_the_same_modules_in_both_networks():
    """peft's LoRA over LORA_TARGETS wraps the same module paths in ours as in diffusers' network, and
    every double-stream block's eight attention projections among them."""
    from hunyuan15_fixtures import reference_transformer
    from peft import LoraConfig, inject_adapter_in_model

    ref = reference_transformer()
    ours = HunyuanVideo15Transformer(our_config(ref))
    config = LoraConfig(r=2, target_modules=list(LORA_TARGETS))
    adapted = []
    for net in (inject_adapter_in_model(config, ref), inject_adapter_in_model(config, ours)):
        adapted.append({n.rsplit(".lora_A", 1)[0] for n, _ in net.named_parameters() if ".lora_A" in n})
    assert adapted[0] == adapted[1]
    block = {
        n.removeprefix("transformer_blocks.0.attn.")
        for n in adapted[1]
        if n.startswith("transformer_blocks.0.")
    }
    assert block == {*LORA_TARGETS}

"""`vidforge model import|export` on tiny random Wan transformers saved by diffusers' own
save_pretrained (sharded, float32 and bfloat16): import -> export gives every tensor back bitwise, the
exported folder loads in WanTransformer3DModel.from_pretrained with no missing or unexpected keys and
computes what vidforge's loaded export computes; bad folders end in one line naming the file, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from diffusers import WanTransformer3DModel
from safetensors import safe_open
from safetensors.torch import save_file
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.profile import load_profile
from vidforge.weights.checkpoint import load_model

runner = CliRunner()
FP32_KEPT = tuple(WanTransformer3DModel._keep_in_fp32_modules)
TINY = {
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "in_channels": 4,
    "out_channels": 4,
    "text_dim": 16,
    "ffn_dim": 40,
    "num_layers": 2,
}


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def _all_tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})
    return out


def _saved_reference(folder: Path, dtype: torch.dtype) -> Path:
    """Several shards and an index. bfloat16 as diffusers holds a model loaded with torch_dtype: the
    modules it keeps in float32 (time embedder, tables, norms) stay float32 in the files."""
    torch.manual_seed(0)
    ref = WanTransformer3DModel(**TINY)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if not any(part in FP32_KEPT for part in name.split(".")):
                p.data = p.data.to(dtype)
    ref.save_pretrained(folder, max_shard_size="20KB")
    return folder


@pytest.fixture
def diffusers_without_accelerate(monkeypatch):
    """diffusers' from_pretrained refuses a model with float32-kept modules unless `accelerate` is
    installed (it is not, here); that list only matters with torch_dtype, so it is cleared for loading.
    The state dict is matched key by key either way."""
    monkeypatch.setattr(WanTransformer3DModel, "_keep_in_fp32_modules", None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_import_export_round_trip_is_bitwise_and_loads_in_diffusers(
    tmp_path, dtype, diffusers_without_accelerate
):
    src = _saved_reference(tmp_path / "wan" / "transformer", dtype)
    assert (src / "diffusion_pytorch_model.safetensors.index.json").is_file()
    # A whole pipeline folder: the transformer/ inside it is found.
    result = invoke("model", "import", str(tmp_path / "wan"), "-o", str(tmp_path / "export"))
    assert result.exit_code == 0, result.output
    assert load_profile(tmp_path / "export" / "profile.yaml").model.family == "wan"
    result = invoke(
        "model", "export", str(tmp_path / "export"), "-o", str(tmp_path / "out"), "--max-shard-mb", "0.02"
    )
    assert result.exit_code == 0, result.output

    assert (tmp_path / "out" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    source, back = _all_tensors(src), _all_tensors(tmp_path / "out")
    assert {t.dtype for t in source.values()} == {torch.float32, dtype}
    assert sorted(source) == sorted(back)
    for name, tensor in source.items():
        assert back[name].dtype == tensor.dtype and torch.equal(
            back[name].view(torch.uint8), tensor.view(torch.uint8)
        ), name

    reloaded, info = WanTransformer3DModel.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ours = load_model(tmp_path / "export", dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4, 2, 4, 4, generator=g)
    t = torch.tensor([0.25])
    text = torch.randn(1, 6, 16, generator=g)
    with torch.no_grad():
        expected = reloaded.float().eval()(x, t * 1000, text, return_dict=False)[0]
        torch.testing.assert_close(ours(x, t, text), expected, rtol=1e-5, atol=1e-5)


def test_import_can_cast_to_one_dtype(tmp_path):
    src = _saved_reference(tmp_path / "transformer", torch.float32)
    result = invoke("model", "import", str(src), "-o", str(tmp_path / "export"), "--dtype", "bfloat16")
    assert result.exit_code == 0, result.output
    imported, source = _all_tensors(tmp_path / "export"), _all_tensors(src)
    assert all(
        t.dtype == torch.bfloat16 and torch.equal(t, source[n].bfloat16()) for n, t in imported.items()
    )


def _error(*args: str) -> str:
    result = invoke("model", *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def test_bad_folders_end_in_one_line_naming_the_file(tmp_path):
    src = _saved_reference(tmp_path / "transformer", torch.float32)
    out = str(tmp_path / "export")

    _edit_config(src, _class_name="AutoencoderKLWan")
    assert "config.json: _class_name is 'AutoencoderKLWan', not WanTransformer3DModel" in _error(
        "import", str(src), "-o", out
    )

    _edit_config(src, _class_name="WanTransformer3DModel", image_dim=1280)
    assert "config.json: image_dim=1280 with added_kv_proj_dim=None cannot be represented" in _error(
        "import", str(src), "-o", out
    )

    _edit_config(src, image_dim=None, attention_head_dim=7)
    assert "config.json cannot be represented: model.hidden: head size hidden/heads = 7" in _error(
        "import", str(src), "-o", out
    )

    _edit_config(src, attention_head_dim=TINY["attention_head_dim"])
    shard = sorted(src.glob("diffusion_pytorch_model-*.safetensors"))[-1]
    shard.rename(tmp_path / "elsewhere.safetensors")
    message = _error("import", str(src), "-o", out)
    assert f"{shard}: missing (named in diffusion_pytorch_model.safetensors.index.json)" in message

    (tmp_path / "elsewhere.safetensors").rename(shard)
    with safe_open(str(shard), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    name = next(iter(tensors))
    tensors[name] = tensors[name].to(torch.int8)
    save_file(tensors, str(shard))
    assert f"{shard}: {name} is I8; vidforge reads float32, bfloat16 or float16" in _error(
        "import", str(src), "-o", out
    )

    assert "--to onnx: diffusers, vidforge with --merged, or comfyui without --merged" in _error(
        "export", out, "-o", out, "--to", "onnx"
    )
    not_export = tmp_path / "nothing"
    not_export.mkdir()
    assert f"{not_export}/config.json:" in _error("export", str(not_export), "-o", out)


def test_whole_pipeline_folder_gives_its_parts_and_loads_without_import(tmp_path, monkeypatch):
    """The Wan2.1-T2V-*-Diffusers layout: the transformer loads straight from it (equal to the imported
    export), and the umT5 text encoder reads its tokenizer from the pipeline's own tokenizer/ folder."""
    from test_text_t5 import SHAPE, VOCAB, _save_tokenizer
    from transformers import UMT5Config, UMT5EncoderModel

    from vidforge.families.wan.weights import load_diffusers_wan, pipeline_parts
    from vidforge.text.encoders import build_text_encoder

    pipeline = tmp_path / "Wan2.1-T2V-tiny-Diffusers"
    _saved_reference(pipeline / "transformer", torch.bfloat16)
    UMT5EncoderModel(UMT5Config(vocab_size=len(VOCAB), **SHAPE)).save_pretrained(pipeline / "text_encoder")
    _save_tokenizer(pipeline / "tokenizer")
    (pipeline / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    parts = pipeline_parts(pipeline)
    assert set(parts) == {"transformer", "text_encoder", "tokenizer"}
    assert pipeline_parts(pipeline / "transformer") == {}

    direct = load_diffusers_wan(pipeline, dtype=torch.float32)
    assert invoke("model", "import", str(pipeline), "-o", str(tmp_path / "export")).exit_code == 0
    imported = load_model(tmp_path / "export", dtype=torch.float32)
    assert all(torch.equal(t, imported.state_dict()[n]) for n, t in direct.state_dict().items())

    sets = [f"text_encoder.path={parts['text_encoder']}", f"text_encoder.tokenizer_path={parts['tokenizer']}"]
    profile = load_profile(
        None, ["text_encoder.kind=t5", "text_encoder.max_length=8", "text_encoder.device=cpu", *sets]
    )
    hidden, mask = build_text_encoder(profile).encode(["a cat runs"])
    assert hidden.shape == (1, 8, SHAPE["d_model"]) and mask[0].tolist() == [True] * 4 + [False] * 4

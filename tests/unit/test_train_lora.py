"""LoRA fine-tuning (`train.lora`, peft): what `build` hands the one training loop is a frozen base in
the compute dtype with fp32 adapters; training moves the adapters and nothing else."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import WAN, losses, make_latents, train_profile  # noqa: E402

from vidforge.errors import UserInputError  # noqa: E402
from vidforge.models import build_model  # noqa: E402
from vidforge.parallel.runtime import init_runtime  # noqa: E402
from vidforge.train import loop  # noqa: E402
from vidforge.train.build import build  # noqa: E402
from vidforge.train.init_weights import WeightsInit  # noqa: E402
from vidforge.train.make_step import make_train_step  # noqa: E402
from vidforge.weights.checkpoint import save_model  # noqa: E402

LORA = ("train.lora={rank: 4, alpha: 8}", "train.lr=1e-2", "train.precision=bf16")


@pytest.fixture(scope="module")
def latents(tmp_path_factory) -> Path:
    return make_latents(tmp_path_factory.mktemp("lora"))


def pretrained(profile, folder: Path) -> Path:
    """An export standing in for a published model: the builder's weights moved off its zero-initialised
    gates (which would keep every attention's gradient at zero in a fresh DiT)."""
    torch.manual_seed(7)
    model = build_model(profile.model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    return save_model(model, folder)


def _train(profile, latents: Path, steps: int, base: Path | None = None):
    runtime = init_runtime(profile)
    parts = build(profile, runtime, WeightsInit(base) if base is not None else None)
    step = make_train_step(profile, runtime, parts)
    batcher = loop.rank_batcher(profile, runtime, [latents])
    before = {name: p.detach().clone() for name, p in parts.modules[0].named_parameters()}
    try:
        for _ in range(steps):
            result = step(step.next_batches(batcher))
            assert result.finite
            step.apply()
    finally:
        getattr(batcher, "close", lambda: None)()  # the prefetch thread, when data.prefetch > 0
    return parts, before


@pytest.mark.parametrize("family", ["wan", "vidforge"])
def test_frozen_weights_stay_bit_identical_and_the_adapters_move(latents, family, tmp_path) -> None:
    profile = train_profile(*LORA, *(WAN if family == "wan" else ()))
    parts, before = _train(profile, latents, 3, pretrained(profile, tmp_path / "base"))
    model = parts.modules[0]
    adapters = {name: p for name, p in model.named_parameters() if ".lora_" in name}
    frozen = {name: p for name, p in model.named_parameters() if ".lora_" not in name}
    # every default target (the attention projections of both attentions in both blocks) has A and B
    assert len(adapters) == 2 * 4 * 2 * 2
    for name, p in frozen.items():
        assert not p.requires_grad and p.dtype == torch.bfloat16, name
        assert torch.equal(p, before[name]), name
    for name, p in adapters.items():
        assert p.requires_grad and p.dtype == torch.float32, name
        assert not torch.equal(p, before[name]), name  # lora_B starts at zero, lora_A random: both moved
    # the optimizer holds the adapters alone, and so does the EMA
    assert sum(len(g["params"]) for g in parts.optimizers[0].param_groups) == len(adapters)
    assert parts.ema is not None and set(parts.ema.names) == set(adapters)
    assert any("LoRA rank 4" in note for note in parts.notes)


def test_unknown_target_modules_are_refused_naming_the_field() -> None:
    profile = train_profile("train.lora={target_modules: [nope]}")
    with pytest.raises(UserInputError, match=r"^train\.lora\.target_modules: .*nope"):
        build(profile, init_runtime(profile))


# --- a LoRA run through `vidforge train`'s loop: checkpoints, resume, the exported adapter ------------

RUN = ("train.lora={rank: 4, alpha: 8}", "train.schedule=constant", "train.ema_decay=0", "train.save_every=2")


@pytest.fixture(scope="module")
def wan_base(tmp_path_factory) -> Path:
    """A diffusers WanTransformer3DModel folder of the tiny wan (random weights), as a download holds."""
    from vidforge.families.wan.weights import export_wan

    root = tmp_path_factory.mktemp("wan_base")
    export = pretrained(train_profile(*WAN), root / "export")
    return export_wan(export, root / "transformer")


def _run(latents: Path, run_dir: Path, base: Path, steps: int, resume: bool = False) -> loop.TrainSummary:
    profile = train_profile(*WAN, *RUN, f"train.steps={steps}")
    return loop.run(profile, [latents], run_dir, resume=resume, init=WeightsInit(base))


@pytest.fixture(scope="module")
def lora_run(latents, wan_base, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("lora_run") / "run"
    _run(latents, run_dir, wan_base, steps=4)
    return run_dir


def test_checkpoints_hold_the_adapters_and_their_optimizer_only(lora_run) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    keys = list(
        FileSystemReader(str(lora_run / "checkpoints" / "step_00000004")).read_metadata().state_dict_metadata
    )
    model_keys = [k for k in keys if k.startswith("model.")]
    optim_keys = [k for k in keys if k.startswith("optim.state.")]
    assert len(model_keys) == 2 * 4 * 2 * 2  # lora_A and lora_B of 4 projections x 2 attentions x 2 blocks
    assert all(".lora_" in k for k in model_keys + optim_keys)
    assert len(optim_keys) == 3 * len(model_keys)  # AdamW: step, exp_avg, exp_avg_sq per adapter


def test_a_resumed_lora_run_gives_the_uninterrupted_runs_losses_and_adapter(
    latents, wan_base, lora_run, tmp_path
) -> None:
    from safetensors.torch import load_file

    from vidforge.lora import WEIGHTS

    _run(latents, tmp_path / "run", wan_base, steps=2)
    with pytest.raises(UserInputError, match="pass the --init it started from again"):
        loop.run(train_profile(*WAN, *RUN, "train.steps=4"), [latents], tmp_path / "run", resume=True)
    _run(latents, tmp_path / "run", wan_base, steps=4, resume=True)
    assert losses(tmp_path / "run") == losses(lora_run)
    resumed, whole = (load_file(run / "export" / WEIGHTS) for run in (tmp_path / "run", lora_run))
    assert resumed.keys() == whole.keys()
    for key in whole:
        assert torch.equal(resumed[key], whole[key]), key


def _wan_inputs(profile, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, profile.model.in_channels, 2, 4, 6, generator=g)
    t = torch.rand(2, generator=g)
    text = torch.randn(2, 5, profile.model.text_dim, generator=g)
    return x, t, text


def test_the_exported_adapter_loaded_into_diffusers_gives_vidforges_forward(wan_base, lora_run) -> None:
    """diffusers' own loader (`load_lora_adapter`, peft underneath) reads the exported file into its
    WanTransformer3DModel; its forward equals vidforge's base + adapter (`load_adapter`), and the adapter
    changes the output (it is not a no-op)."""
    from diffusers import WanTransformer3DModel

    from vidforge.families.wan.weights import load_diffusers_wan
    from vidforge.lora import load_adapter

    profile = train_profile(*WAN)
    x, t, text = _wan_inputs(profile)
    reference = WanTransformer3DModel.from_pretrained(wan_base).eval()
    with torch.no_grad():
        base_out = reference(x, t * 1000, text, return_dict=False)[0]
        reference.load_lora_adapter(str(lora_run / "export"), prefix="transformer", use_safetensors=True)
        expected = reference(x, t * 1000, text, return_dict=False)[0]
        ours = load_adapter(load_diffusers_wan(wan_base), lora_run / "export").eval()
        out = ours(x, t, text)
    assert (expected - base_out).abs().max() > 1e-3
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # the pipeline's loader (WanPipeline.load_lora_weights) reads it through lora_state_dict: every
    # tensor under the transformer's prefix, the rank and alpha from the file's metadata
    from diffusers import WanPipeline

    state, metadata = WanPipeline.lora_state_dict(str(lora_run / "export"), return_lora_metadata=True)
    assert len(state) == 32 and all(key.startswith("transformer.blocks.") for key in state)
    assert metadata["transformer.r"] == 4 and metadata["transformer.lora_alpha"] == 8


def test_the_merged_models_forward_equals_base_plus_adapter(wan_base, lora_run, tmp_path) -> None:
    from typer.testing import CliRunner

    from vidforge.cli.app import app
    from vidforge.families.wan.weights import load_diffusers_wan
    from vidforge.lora import load_adapter
    from vidforge.profile import load_profile
    from vidforge.weights.checkpoint import load_model

    merged = tmp_path / "merged"  # the base comes from the run's record of its --init
    result = CliRunner().invoke(
        app, ["model", "export", str(lora_run), "--merged", "--to", "vidforge", "-o", str(merged)]
    )
    assert result.exit_code == 0, result.output
    x, t, text = _wan_inputs(train_profile(*WAN))
    with torch.no_grad():
        expected = load_adapter(load_diffusers_wan(wan_base), lora_run).eval()(x, t, text)
        out = load_model(merged).eval()(x, t, text)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert load_profile(merged / "profile.yaml").train.lora is None  # full weights now
    # and as diffusers' folder: from_pretrained of the merged weights gives the same forward
    from diffusers import WanTransformer3DModel

    as_diffusers = tmp_path / "merged_diffusers"
    result = CliRunner().invoke(
        app, ["model", "export", str(lora_run), "--merged", "--base", str(wan_base), "-o", str(as_diffusers)]
    )
    assert result.exit_code == 0, result.output
    with torch.no_grad():
        theirs = WanTransformer3DModel.from_pretrained(as_diffusers).eval()(
            x, t * 1000, text, return_dict=False
        )[0]
    torch.testing.assert_close(theirs, expected, rtol=1e-5, atol=1e-5)


def test_model_export_of_a_lora_run_without_merged_says_what_export_already_is(lora_run, tmp_path) -> None:
    from typer.testing import CliRunner

    from vidforge.cli.app import app

    result = CliRunner().invoke(app, ["model", "export", str(lora_run), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert "already is a diffusers LoRA" in line and "--merged" in line
    assert line.count(str(lora_run)) == 2  # the run, then its export/ folder: each once
    assert not (tmp_path / "out").exists()


def _frames(path: str):
    import av
    import numpy as np

    with av.open(path) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)]).astype(int)


def test_infer_with_an_adapter_at_scale_0_is_the_base_and_at_scale_1_the_merged_model(
    wan_base, lora_run, tmp_path
) -> None:
    from vidforge.infer import run as infer_run
    from vidforge.train.merge_lora import export_merged

    sets = [
        "diffusion.steps=3",
        "infer.frames=9",
        "infer.height=16",
        "infer.width=24",
        "diffusion.guidance=1",
        "infer.fps=16",  # the folder's (Wan's); the run's profile says 8, and x264's rate control reads it
    ]
    prompt = ["a red square moving right"]

    def sample(checkpoint, name, **lora) -> str:
        return infer_run.run(checkpoint, prompt, tmp_path / name, overrides=sets, **lora).videos[0]

    base = sample(wan_base, "base")
    off = sample(wan_base, "off", lora=lora_run, lora_scale=0.0)
    on = sample(wan_base, "on", lora=lora_run, lora_scale=1.0)
    merged = sample(export_merged(lora_run, tmp_path / "merged"), "merged")
    assert Path(off).read_bytes() == Path(base).read_bytes()
    with pytest.raises(UserInputError, match="a LoRA adapter, not a model; pass its base as --checkpoint"):
        infer_run.run(lora_run, prompt, tmp_path / "wrong", overrides=sets)
    # merged weights round differently from base + adapter: a pixel a level or two off before H.264;
    # the adapter itself moves the video by far more
    diff = abs(_frames(on) - _frames(merged))
    assert diff.mean() < 0.05 and diff.max() <= 16, (diff.mean(), diff.max())
    assert abs(_frames(on) - _frames(base)).mean() > 10 * max(diff.mean(), 0.01)


@pytest.mark.parametrize(("preset", "family"), [("wan2.1-1.3b", "wan"), ("dit-1b", "vidforge")])
def test_the_memory_model_counts_no_gradients_or_optimizer_states_for_the_frozen_base(preset, family) -> None:
    """Closed form, per rank of FSDP over 8 ranks, EMA on: full fine-tuning keeps P x (4 + 4 + 8 + 4) B of
    state; LoRA keeps the base in bf16 (2 B a parameter) and its A adapter parameters at 4 + 4 + 8 + 4 B,
    A = sum over the targeted Linear layers of rank x (in + out). `bench plan` evaluates the same."""
    from torch import nn

    from vidforge.bench.plan import evaluate
    from vidforge.estimate.memory_model import estimate_memory
    from vidforge.lora import default_targets
    from vidforge.profile import load_profile

    sets = [f"model.preset={preset}", "cluster.gpus_per_node=8", "parallel.dp_shard=8", "train.ema_decay=0.9"]
    if family == "wan":
        sets += list(WAN)
    full = load_profile("dit1b_1xh200", sets)
    lora = load_profile("dit1b_1xh200", [*sets, "train.lora={rank: 16}"])
    model = build_model(full.model, device="meta")
    params = sum(p.numel() for p in model.parameters())
    targets = default_targets(family)
    adapters = sum(
        16 * (m.in_features + m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and name.endswith(tuple(f".{t}" for t in targets))
    )
    assert adapters > 0
    shards = 8
    full_state, lora_state = (estimate_memory(p).state for p in (full, lora))
    assert full_state == pytest.approx(params * 20 / shards, rel=1e-12)
    assert lora_state == pytest.approx((params * 2 + adapters * 20) / shards, rel=1e-12)
    assert evaluate(lora).memory.state == pytest.approx(lora_state, rel=1e-12)


def test_the_dry_run_counts_the_shards_fsdp_made_of_a_bf16_base_and_fp32_adapters() -> None:
    """`vidforge train --dry-run` builds rank 0 of FSDP over 4 ranks (fake process group) with the
    trainer's own build: rank 0's shard of each parameter is ceil(rows / 4) of its rows (torch.chunk);
    the base's at 2 B, the adapters' (lora_A: rank x in, lora_B: out x rank) at 4 B, and gradients, AdamW
    states and EMA for the adapters alone."""
    import math

    from vidforge.profile import load_profile
    from vidforge.train.dry_run import dry_run

    sets = ["cluster.cpu_processes=4", "parallel.dp_shard=4", "train.precision=bf16", "train.ema_decay=0.9"]
    profile = load_profile("local_cpu", [*sets, "train.lora={rank: 4}"])

    def shard(*shape: int) -> int:
        return math.ceil(shape[0] / 4) * math.prod(shape[1:])

    model = build_model(profile.model, device="meta")
    base = sum(shard(*p.shape) for p in model.parameters())
    adapters = sum(
        shard(4, m.in_features) + shard(m.out_features, 4)
        for name, m in model.named_modules()
        if name.rsplit(".", 1)[-1] in ("q", "k", "v", "out") and isinstance(m, torch.nn.Linear)
    )
    stage = dry_run(profile).stages[0]
    assert stage.parameters == base + adapters
    assert stage.parameter_bytes == 2 * base + 4 * adapters
    assert stage.gradient_bytes == stage.ema_bytes == 4 * adapters
    assert stage.optimizer_bytes == 8 * adapters


def test_resuming_with_another_lora_rank_or_init_is_refused_naming_it(
    latents, wan_base, lora_run, tmp_path
) -> None:
    """Issue 38, points 4 and 5: another rank was DCP's traceback; another --init continued silently,
    training the adapters on another base (and the export named the new one)."""
    import shutil

    run = Path(shutil.copytree(lora_run, tmp_path / "run"))
    ranked = train_profile(*WAN, *RUN, "train.steps=6", "train.lora={rank: 8, alpha: 8}")
    with pytest.raises(UserInputError) as err:
        loop.run(ranked, [latents], run, resume=True, init=WeightsInit(wan_base))
    assert str(err.value).startswith(
        "--resume: the run was trained with train.lora.rank=4, this command has train.lora.rank=8; "
    )
    other = Path(shutil.copytree(wan_base, tmp_path / "other_base"))
    with pytest.raises(UserInputError) as err:
        _run(latents, run, other, steps=6, resume=True)
    assert str(err.value) == (
        f"--resume: the run's LoRA adapters were trained on --init {wan_base.resolve()}, this command "
        f"passes --init {other.resolve()}; pass the run's --init again, or a new --run-dir"
    )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000002", "step_00000004"]


def test_the_exported_adapter_file_is_the_same_bytes_every_time(lora_run, tmp_path) -> None:
    """Issue 38, point 10: safetensors writes its metadata from a Rust HashMap, whose order changes from
    run to run: two identical runs exported different bytes. The header is written with sorted keys."""
    import json as _json

    from safetensors.torch import load_file

    from vidforge.lora import WEIGHTS, save_adapter
    from vidforge.profile.train import Lora

    weights = {
        k.replace("transformer.", "", 1)
        .replace(".lora_A.", ".lora_A.default.")
        .replace(".lora_B.", ".lora_B.default."): v
        for k, v in load_file(lora_run / "export" / WEIGHTS).items()
    }
    profile = train_profile(*WAN, *RUN)
    files = [
        save_adapter(tmp_path / str(i), weights, profile.model, profile.train.lora or Lora(), 4, None)
        / WEIGHTS
        for i in range(8)
    ]
    first = files[0].read_bytes()
    assert all(f.read_bytes() == first for f in files[1:])
    n = int.from_bytes(first[:8], "little")
    header = _json.loads(first[8 : 8 + n])
    assert list(header) == sorted(header) and list(header["__metadata__"]) == sorted(header["__metadata__"])
    assert load_file(files[0]).keys() == load_file(lora_run / "export" / WEIGHTS).keys()


def test_an_adapter_is_found_in_a_finetune_runs_train_export_else_the_error_names_where_it_looked(
    lora_run, tmp_path
) -> None:
    """`--lora RUN` of a `vidforge finetune` run: its train stage's export (RUN/train/export)."""
    import shutil

    from vidforge.lora import read_adapter

    run = tmp_path / "finetune"
    shutil.copytree(lora_run, run / "train")
    assert read_adapter(run)["folder"] == run / "train" / "export"
    with pytest.raises(UserInputError) as err:
        read_adapter(tmp_path / "empty")
    message = str(err.value)
    assert "\n" not in message
    for place in ("empty/export", "empty/train/export", f"{tmp_path / 'empty'};"):
        assert place in message, place


def test_the_commands_finetune_prints_for_a_lora_run_run_as_printed(wan_base, lora_run, tmp_path) -> None:
    """`vidforge finetune`'s next commands (`_next_commands`) on a finetune run's folder: `infer -c BASE
    --lora RUN` samples what the adapter folder itself samples, `model export RUN --merged` folds it."""
    import shlex
    import shutil

    from typer.testing import CliRunner

    from vidforge import finetune
    from vidforge.cli.app import app
    from vidforge.files import FINETUNE_TRAIN
    from vidforge.infer import run as infer_run
    from vidforge.profile import load_profile

    run = tmp_path / "finetune"
    shutil.copytree(lora_run, run / FINETUNE_TRAIN)
    profile = load_profile(lora_run / "export" / "profile.yaml")
    sample, merge, _ = finetune._next_commands(profile, wan_base, run, None, "a red square moving right")
    sets = ["diffusion.steps=2", "infer.frames=5", "infer.height=16", "infer.width=16", "infer.fps=16"]
    argv = shlex.split(sample)
    assert argv[:6] == ["vidforge", "infer", "-c", str(wan_base), "--lora", str(run)]
    result = CliRunner().invoke(app, [*argv[1:], *(a for s in sets for a in ("--set", s))])
    assert result.exit_code == 0, result.output
    prompt = [argv[argv.index("--prompt") + 1]]
    adapter = infer_run.run(wan_base, prompt, tmp_path / "adapter", overrides=sets, lora=lora_run / "export")
    (printed,) = (run / "samples").glob("*.mp4")
    assert printed.read_bytes() == Path(adapter.videos[0]).read_bytes()
    result = CliRunner().invoke(app, shlex.split(merge)[1:])
    assert result.exit_code == 0, result.output
    assert (run / "merged" / "transformer" / "config.json").is_file()

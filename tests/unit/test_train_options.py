"""Training settings beyond the default run: periodic validation, activation checkpointing, torch.compile,
the SLURM/torchrun launch helpers and the FP8 refusal."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import losses, make_latents, train_profile  # noqa: E402

from vidforge.errors import UserInputError  # noqa: E402
from vidforge.models import build_model  # noqa: E402
from vidforge.parallel import launch  # noqa: E402
from vidforge.train import loop, validation  # noqa: E402
from vidforge.train.ema import EMA  # noqa: E402
from vidforge.weights.checkpoint import load_model  # noqa: E402

SHORT = (
    "train.steps=4",
)  # validation at step 3, then one more step that shows whether it disturbed training


@pytest.fixture(scope="module")
def latents(tmp_path_factory) -> Path:
    return make_latents(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def baseline(latents, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("baseline")
    loop.run(train_profile(*SHORT), [latents], run_dir)
    return run_dir


# --- periodic validation ----------------------------------------------------------------------------------


def test_validation_writes_videos_and_leaves_training_alone(latents, baseline, tmp_path) -> None:
    prompts = ["a red square moving right", "a blue circle"]
    sets = (*SHORT, "train.validate_every=3", f"train.validation_prompts={prompts}".replace("'", '"'))
    loop.run(train_profile(*sets), [latents], tmp_path)
    out = tmp_path / "validation" / "step_00000003"
    assert sorted(p.name for p in out.iterdir()) == [
        "a-blue-circle.mp4",
        "a-red-square-moving-right.mp4",
        "contact_sheet.png",
        "prompts.json",
    ]
    assert all(p.stat().st_size > 0 for p in out.iterdir())
    assert not (tmp_path / "validation" / "step_00000004").exists()
    assert losses(tmp_path) == losses(baseline)  # bitwise: step 4 trained on the same weights and RNG


def test_validate_samples_the_ema_weights_and_restores_the_training_ones(tmp_path, monkeypatch) -> None:
    profile = train_profile()
    torch.manual_seed(0)
    model = build_model(profile.model)
    ema = EMA(model, 0.9)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # training weights now differ from the EMA everywhere
    trained = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen: dict[str, torch.Tensor] = {}
    real = validation.sample_latents

    def spy(m, *args, **kwargs):
        seen.update({n: p.detach().clone() for n, p in m.named_parameters()})
        assert not m.training
        return real(m, *args, **kwargs)

    monkeypatch.setattr(validation, "sample_latents", spy)
    validation.validate(profile, model, ema, tmp_path / "v", rank=0, prompts=["a red square moving right"])
    for name, shadow in ema.state_dict().items():
        torch.testing.assert_close(seen[name], shadow, rtol=0, atol=0)
    for name, p in model.named_parameters():
        assert torch.equal(p, trained[name]), name
    assert model.training and (tmp_path / "v" / "contact_sheet.png").is_file()


def test_a_fine_tune_validates_by_default_on_the_datas_captions(latents, baseline, tmp_path) -> None:
    """--init with no validation settings: four validations over the run and one at its end, prompts from
    the data's captions (the annotated manifest the shards came from), each step's samples in
    RUN/validation/, a console line naming the folder, and frames in TensorBoard."""
    import json

    from tensorboard.backend.event_processing.event_accumulator import IMAGES, EventAccumulator

    from vidforge.data.manifest import read_jsonl
    from vidforge.train.init_weights import WeightsInit

    lines: list[str] = []
    profile = train_profile(
        "train.steps=5", "train.save_every=5", "train.validate_every=null", "diffusion.steps=2"
    )
    loop.run(profile, [latents], tmp_path, init=WeightsInit(baseline), notice=lines.append)
    captions = {r["caption"] for r in read_jsonl(latents.parent / "annotated" / "manifest.jsonl")}
    steps = sorted(int(p.name.removeprefix("step_")) for p in (tmp_path / "validation").iterdir())
    assert steps == [2, 4, 5]  # every ceil(5 / 4) = 2 steps, and the last one
    prompts = json.loads((tmp_path / "validation" / "step_00000005" / "prompts.json").read_text())
    assert 1 <= len(prompts) <= validation.DATA_PROMPTS and set(prompts.values()) <= captions
    assert all((tmp_path / "validation" / "step_00000005" / name).stat().st_size > 0 for name in prompts)
    assert [line for line in lines if "validation videos" in line] == [
        f"step {s}: validation videos of {len(prompts)} prompt(s) in {tmp_path / 'validation' / f'step_{s:08d}'}"
        for s in steps
    ]
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={IMAGES: 0})
    events.Reload()
    assert [e.step for e in events.Images("validation/0")] == steps


def test_a_run_from_scratch_does_not_validate_unless_asked(latents, baseline) -> None:
    assert not (baseline / "validation").exists()


def test_a_missing_tracker_is_refused_before_the_build(latents, tmp_path) -> None:
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed")
    with pytest.raises(UserInputError, match="pip install wandb"):
        loop.run(train_profile('train.trackers=["tensorboard","wandb"]'), [latents], tmp_path)
    assert not (tmp_path / "checkpoints").exists()


def test_wandb_gets_the_validation_videos(latents, tmp_path, monkeypatch) -> None:
    """Offline (nothing leaves the machine); skipped without wandb, which is not a dependency."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sets = ("train.steps=2", "train.validate_every=2", 'train.validation_prompts=["a blue circle"]')
    loop.run(train_profile(*sets, 'train.trackers=["tensorboard","wandb"]'), [latents], tmp_path)
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    assert len(list(run.glob("run-*.wandb"))) == 1
    assert len(list((run / "files" / "media" / "videos" / "validation").glob("0_2_*.mp4"))) == 1


# --- activation checkpointing and offloading ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode,offload", [("full", 0.0), ("selective", 0.0), ("none", 1.0), ("selective", 0.5)]
)
def test_activation_checkpointing_and_offload_keep_the_losses_and_export_plain_weights(
    mode, offload, latents, baseline, tmp_path, monkeypatch
) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from vidforge.memory_savers.activation_offload import OffloadedBlock

    built: list[nn.Module] = []
    from vidforge.train import build as train_build

    real_build = train_build.build_model

    def build(*args, **kwargs):
        built.append(real_build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(train_build, "build_model", build)
    sets = (f"train.activation_checkpointing={mode}", f"train.activation_offload={offload}")
    loop.run(train_profile(*SHORT, *sets), [latents], tmp_path)
    blocks = list(built[0].blocks.values())
    n = len(blocks)
    offloaded = {i for i, b in enumerate(blocks) if isinstance(b, OffloadedBlock)}
    checkpointed = {i for i, b in enumerate(blocks) if isinstance(b, CheckpointWrapper)}
    assert len(checkpointed) == {"full": n, "selective": round(0.5 * n), "none": 0}[mode]
    assert len(offloaded) == round(offload * n)
    assert not offloaded & checkpointed  # Vchitect's combination: a block recomputes or offloads
    assert losses(tmp_path) == pytest.approx(losses(baseline), rel=0, abs=1e-6)
    exported = load_model(tmp_path / "export")  # strict load: no _checkpoint_wrapped_module in the names
    reference = load_model(baseline / "export")
    for (name, p), (ref_name, ref) in zip(
        exported.named_parameters(), reference.named_parameters(), strict=True
    ):
        assert name == ref_name and "_checkpoint_wrapped_module" not in name
        torch.testing.assert_close(p, ref, rtol=1e-4, atol=1e-5)


# --- torch.compile -----------------------------------------------------------------------------------------


def test_compile_wiring_with_the_eager_backend(latents, baseline, tmp_path, monkeypatch) -> None:
    """The loop's compile path (blocks wrapped in OptimizedModule, `_orig_mod.` stripped on export), traced by
    dynamo but run by the eager backend so no C++ toolchain or minutes of inductor codegen are needed."""
    real = torch.compile
    compiled: list[nn.Module] = []

    def eager_compile(module, **kwargs):
        compiled.append(real(module, backend="eager", **kwargs))
        return compiled[-1]

    monkeypatch.setattr(torch, "compile", eager_compile)
    loop.run(train_profile(*SHORT, "train.compile=true"), [latents], tmp_path)
    assert compiled and all(hasattr(m, "_orig_mod") for m in compiled)
    assert losses(tmp_path) == pytest.approx(losses(baseline), rel=0, abs=1e-5)
    assert all("_orig_mod" not in n for n, _ in load_model(tmp_path / "export").named_parameters())


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("VIDFORGE_TEST_INDUCTOR"),
    reason="measured: inductor (C++ codegen) on the tiny DiT takes ~110 s for 3 steps on 2 CPU cores, losses "
    "matched eager; set VIDFORGE_TEST_INDUCTOR=1 to run it",
)
def test_compile_with_inductor_matches_eager(latents, baseline, tmp_path) -> None:
    loop.run(train_profile(*SHORT, "train.compile=true"), [latents], tmp_path)
    assert losses(tmp_path) == pytest.approx(losses(baseline), rel=0, abs=1e-5)


# --- FP8 ---------------------------------------------------------------------------------------------------


def test_fp8_is_refused_on_cpu_naming_the_field(latents, tmp_path) -> None:
    with pytest.raises(UserInputError, match=r"train\.fp8: .*(torchao|CUDA GPU)"):
        loop.run(train_profile(*SHORT, "train.fp8=true"), [latents], tmp_path)


def test_fp8_layer_filter() -> None:
    from vidforge.parallel.float8 import float8_eligible

    assert float8_eligible(nn.Linear(64, 256), "blocks.0.mlp.fc1")
    assert not float8_eligible(nn.Linear(64, 24), "blocks.0.x")
    assert not float8_eligible(nn.Linear(64, 192), "final.proj")


def _fp8_forward_backward(model: nn.Module, text_tokens: int) -> None:
    """A plain batch's forward and backward on the meta device, where torch checks `_scaled_mm` against
    CUDA's shape rules (no GPU needed): the caption's tokens are what the weight gradient of the
    cross-attention's key and value projections contracts over."""
    from vidforge.tokens import patchify, token_grid

    config = model.config
    latents = torch.randn(1, config.in_channels, 3, 4, 6, device="meta")
    text = torch.randn(1, text_tokens, config.text_dim, device="meta")
    grid = token_grid(latents.shape[2:], tuple(config.patch))
    x = patchify(latents, tuple(config.patch))
    model(x, noise_level=torch.rand(1, device="meta"), text=text, grid=grid).sum().backward()


def test_fp8_layers_take_token_counts_that_are_not_multiples_of_16() -> None:
    """The GPU suite's fp8 crash (`_scaled_mm`: "Expected self.size(1) to be divisible by 16, but got 29",
    a packed row's 29 caption tokens) reproduced on the meta device, and gone with the conversion
    train.fp8 makes: here 72 video tokens, 29 caption tokens and one sample (the modulation's rows)."""
    pytest.importorskip("torchao", reason="torchao (the `gpu` extra) is not installed")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from vidforge.parallel.float8 import convert_to_float8, float8_eligible

    profile = train_profile()
    unpadded = build_model(profile.model, device="meta")
    convert_to_float8_training(unpadded, config=Float8LinearConfig(), module_filter_fn=float8_eligible)
    with pytest.raises(RuntimeError, match="divisible by 16"):
        _fp8_forward_backward(unpadded, text_tokens=29)
    model = build_model(profile.model, device="meta")
    assert "blocks.0.cross_attn.k" in convert_to_float8(model, "tensorwise")
    _fp8_forward_backward(model, text_tokens=29)
    # the padding changes no number: torch's CPU float8 matmul takes 29 rows as they are
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(64, 64)) for _ in range(2)]
    layers[1].load_state_dict(layers[0].state_dict())
    convert_to_float8_training(layers[0], config=Float8LinearConfig())
    convert_to_float8(layers[1], "tensorwise")
    x = torch.randn(29, 64)
    (plain_out, plain_grad), (padded_out, padded_grad) = [
        (out := layer(x), torch.autograd.grad(out.square().sum(), layer[0].weight)[0]) for layer in layers
    ]
    torch.testing.assert_close(padded_out, plain_out)
    torch.testing.assert_close(padded_grad, plain_grad)


# --- launch: SLURM and --nproc -----------------------------------------------------------------------------


def _clear_dist_env(monkeypatch) -> None:
    for key in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
    ):
        # setenv first so monkeypatch records the key's original state and restores it even when the code
        # under test writes os.environ itself (slurm_to_torch_env sets RANK, WORLD_SIZE, ...)
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)


def test_slurm_variables_become_torch_distributed_ones(monkeypatch) -> None:
    _clear_dist_env(monkeypatch)
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("MASTER_ADDR", "node001")
    assert launch.slurm_to_torch_env() is True
    env = os.environ
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("5", "8", "1")
    assert env["MASTER_ADDR"] == "node001" and env["MASTER_PORT"] == "29500"
    assert launch.under_launcher()
    assert launch.slurm_to_torch_env() is False  # already mapped: nothing to do


def test_slurm_leaves_torchrun_and_plain_runs_alone(monkeypatch) -> None:
    _clear_dist_env(monkeypatch)
    assert launch.slurm_to_torch_env() is False  # no SLURM at all
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert launch.slurm_to_torch_env() is False  # torchrun set them: keep them
    assert os.environ["RANK"] == "1"


def test_slurm_without_master_addr_is_an_error(monkeypatch) -> None:
    _clear_dist_env(monkeypatch)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        launch.slurm_to_torch_env()


@pytest.mark.parametrize("accelerator", ["cpu", "h100"])
def test_nproc_alone_sets_a_one_node_world_of_that_size(accelerator) -> None:
    from vidforge.profile import load_profile

    sets = [f"cluster.accelerator={accelerator}", "cluster.nodes=4", "cluster.cpu_processes=5"]
    profile = load_profile("local_cpu", [*sets, *launch.nproc_overrides(3)])
    assert (profile.cluster.nodes, profile.cluster.world_size, profile.layout.world_size) == (1, 3, 3)
    assert launch.nproc_overrides(None) == []


def test_a_worker_reports_its_failure_and_the_parent_raises_the_user_error_once(
    monkeypatch, tmp_path
) -> None:
    _clear_dist_env(monkeypatch)
    monkeypatch.setenv(launch.REPORTS_ENV, str(tmp_path))
    assert launch.report_failure("user", "x") is False  # not a worker: the caller prints it itself
    monkeypatch.setenv("WORLD_SIZE", "3")
    for rank, kind, message in [(2, "failure", "ValueError: boom"), (1, "user", "fix the data")]:
        monkeypatch.setenv("RANK", str(rank))
        assert launch.report_failure(kind, message) is True
    err = launch._first_failure(tmp_path, RuntimeError("child failed"))
    assert isinstance(err, UserInputError) and str(err) == "fix the data"
    (tmp_path / "rank1.json").unlink()
    err = launch._first_failure(tmp_path, RuntimeError("child failed"))
    assert isinstance(err, launch.RanksFailed) and str(err) == "rank 2: ValueError: boom"

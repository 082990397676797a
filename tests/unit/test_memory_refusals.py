"""Settings that cannot fit any machine are refused at load, in one line naming the setting, exit 2, by
arithmetic (issue 38, point 8): before, each ran until the allocator or the kernel stopped it (past 3-6
GB in 6-21 s on the reporter's machine, or a 4 TB allocation). The sizes here exceed every machine's
memory, so the tests hold wherever they run; each refusal must come before the work starts (seconds)."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import LATENT_SHAPE, TRAIN_SETS, synthetic_latents, train_profile  # noqa: E402

from vidforge.cli.app import app  # noqa: E402
from vidforge.data.shard_index import write_index  # noqa: E402
from vidforge.errors import UserInputError  # noqa: E402
from vidforge.infer.run import check_memory  # noqa: E402
from vidforge.memory import host_memory_bytes  # noqa: E402


@pytest.fixture(scope="module")
def latents(tmp_path_factory) -> Path:
    return synthetic_latents(tmp_path_factory.mktemp("mem"))


def _refused(args: list[str], sets: list[str]) -> str:
    for s in sets:
        args += ["--set", s]
    started = time.perf_counter()
    result = CliRunner().invoke(app, args)
    took = time.perf_counter() - started
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert took < 60, took  # refused at load, not found out by the allocator
    return lines[0]


def test_a_model_larger_than_any_machine_is_refused_before_it_is_built(latents, tmp_path) -> None:
    line = _refused(
        ["train", "--data", str(latents), "--run-dir", str(tmp_path / "run")],
        [*TRAIN_SETS, "model.hidden=1000000"],
    )
    assert line.startswith("error: the model (") and " parameters at 16 bytes) needs at least " in line, line
    assert line.endswith(
        "; lower model.hidden, model.layers or model.mlp_hidden (or pick a smaller "
        "model.preset), or train on more ranks"
    )
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_pack_buffer_of_a_billion_samples_is_refused(latents, tmp_path) -> None:
    line = _refused(
        ["train", "--data", str(latents), "--run-dir", str(tmp_path / "run")],
        [*TRAIN_SETS, "data.packing=true", "data.pack_buffer=1000000000"],
    )
    assert line.startswith("error: data.pack_buffer=1000000000 (samples of "), line
    assert line.endswith("; lower data.pack_buffer (64 packs well)")


def test_a_dry_run_of_a_billion_nodes_is_refused() -> None:
    line = _refused(["train", "--dry-run"], ["cluster.nodes=1000000000"])
    assert line.startswith("error: a dry run of 1,000,000,000 ranks "), line
    assert line.endswith("; lower cluster.nodes or cluster.gpus_per_node")


def test_a_bucket_no_machine_can_hold_is_refused_before_a_clip_is_decoded(tmp_path) -> None:
    write_index(tmp_path / "shards", "media", [])
    line = _refused(
        ["tokenize", str(tmp_path / "shards"), "-o", str(tmp_path / "out")],
        ["data.buckets=[[65536,65536]]", "data.frame_buckets=[33]"],
    )
    assert line.startswith("error: data.buckets: a clip of 33 frames (data.frame_buckets) at 65536x65536 "), (
        line
    )
    assert not (tmp_path / "out").exists()


def test_an_infer_size_no_machine_can_hold_is_refused_and_a_small_one_passes() -> None:
    profile = train_profile(
        "infer.frames=257", "infer.height=16384", "infer.width=16384", "infer.batch_size=1"
    )
    shape = (192, 65, 4096, 4096)  # the pixel tokenizer's latents of that size
    need = 3 * math.prod(shape) * 4  # the sampler's state, and both predictions under guidance, in fp32
    assert need > host_memory_bytes()
    with pytest.raises(UserInputError) as err:
        check_memory(profile, shape, 1, torch.device("cpu"), 1)
    assert str(err.value).startswith(
        "infer.frames x height x width = 257 x 16384 x 16384 (latents 192 x 65 x 4096 x 4096, 1 a batch, 3 "
        f"held at once) needs at least {need / 2**30:,.1f} GiB, more than the "
    )
    check_memory(train_profile(), LATENT_SHAPE, 2, torch.device("cpu"), 1)


def test_sampling_holds_both_experts_of_a_two_expert_model() -> None:
    """`vidforge infer` keeps both experts on the device (it switches between them within a video; a run
    trains one): an A14B-shaped model whose one network at 2 bytes a parameter fills 60% of this machine's
    memory is refused for sampling with two experts and passes with one."""
    from vidforge.estimate.param_counts import parameter_counts
    from vidforge.profile.loading import validate_profile

    def profile(width: int):  # four blocks of the expert's shape (heads of 128) scaled to `width`
        model = {"preset": "wan2.2-t2v-a14b", "layers": 4, "hidden": width, "heads": width // 128}
        model["mlp_hidden"] = 27 * width // 10
        return validate_profile({"model": model, "diffusion": {"objective": "flow"}})

    # parameters grow with the width squared: the width whose one network fills 60% of the memory
    reference = parameter_counts(profile(5120).model).total
    scale = (0.6 * host_memory_bytes() / (2 * reference)) ** 0.5
    two = profile(max(1, round(5120 * scale / 128)) * 128)
    one = two.model_copy(
        update={"model": two.model.model_copy(update={"experts": 1, "boundary_ratio": None})}
    )
    assert 2 * parameter_counts(one.model).total < host_memory_bytes() < 4 * parameter_counts(one.model).total
    shape = (16, 2, 8, 8)
    check_memory(one, shape, 1, torch.device("cpu"), 1)
    with pytest.raises(UserInputError, match=r"^the model \([\d,]+ parameters at 2 bytes\) needs at least"):
        check_memory(two, shape, 1, torch.device("cpu"), 1)

"""`init_runtime`: the one place that picks a process's device and starts torch.distributed. Each rank of a
node must drive its own GPU (`cuda:LOCAL_RANK`), chosen before the process group starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from vidforge.device import select_device
from vidforge.errors import UserInputError
from vidforge.parallel import runtime as rt
from vidforge.parallel.dims import ParallelDims
from vidforge.profile import load_profile

SRC = Path(rt.__file__).resolve().parents[1]


@pytest.fixture
def eight_fake_gpus(monkeypatch):
    """torch.cuda as on an 8-GPU node; records the devices made current."""
    current: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: current.append(torch.device(device)))
    return current


@pytest.mark.parametrize("local_rank", [0, 3, 7])
def test_each_rank_of_a_node_takes_the_gpu_of_its_local_rank(
    eight_fake_gpus, monkeypatch, local_rank
) -> None:
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: no group to start
    runtime = rt.init_runtime(load_profile("dit1b_1xh200"))
    assert runtime.device == torch.device("cuda", local_rank)
    assert runtime.local_rank == local_rank
    assert eight_fake_gpus == [torch.device("cuda", local_rank)]  # made current before any group starts
    assert (runtime.rank, runtime.world) == (0, 1)


def test_a_task_that_sees_one_gpu_takes_it(monkeypatch) -> None:
    """SLURM with one GPU per task: LOCAL_RANK 5 and a single visible device."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert select_device("cuda") == torch.device("cuda", 0)


def test_device_choices_without_a_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert select_device("auto") == torch.device("cpu")
    assert select_device("cpu") == torch.device("cpu")
    with pytest.raises(UserInputError, match="cluster.accelerator: the profile asks for CUDA"):
        select_device("cuda")
    assert rt.init_runtime(load_profile("local_cpu")).device == torch.device("cpu")


ENTRY_POINTS = (
    "train/loop.py",
    "bench/train_bench.py",
    "bench/infer_bench.py",
    "bench/attention_bench.py",
    "infer/run.py",
    "tokenizers/tokenize.py",
)


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_entry_point_starts_through_init_runtime(module: str) -> None:
    assert "init_runtime(" in (SRC / module).read_text()


def test_nothing_else_picks_a_device_or_starts_a_process_group() -> None:
    owners = {"parallel/runtime.py", "train/dry_run.py"}  # the dry run starts torch's fake group
    pattern = re.compile(r"torch\.cuda\.set_device|torch\.cuda\.current_device|init_process_group\(")
    offenders = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if str(path.relative_to(SRC)) not in owners and pattern.search(path.read_text())
    ]
    assert offenders == []


@pytest.mark.parametrize(
    ("name", "sets", "command"),
    [
        ("dit7b_8k_tp2_64xh100", [], "`sbatch --nodes=8 commands/train-slurm.sbatch PROFILE LATENTS RUN`"),
        ("tiny_cpu4_tp2_cp2", [], "`torchrun --nnodes 1 --nproc-per-node 4 -m vidforge ...`"),
        ("local_cpu", ["cluster.cpu_processes=2"], "use --nproc 2;"),
    ],
)
def test_a_wrong_number_of_ranks_is_told_the_profiles_launch_command(name, sets, command) -> None:
    """`cluster.launcher` names how the profile's ranks start; one process of a larger layout is told that
    command, on one line. The SLURM recipe takes the profile, the latents and the run in that order."""
    profile = load_profile(name, sets)
    runtime = rt.Runtime(0, 1, 0, torch.device("cpu"), ParallelDims(profile.layout))
    with pytest.raises(UserInputError) as err:
        runtime.require_layout(profile.cluster)
    assert command in str(err.value) and "\n" not in str(err.value)
    recipe = (SRC.parents[1] / "commands" / "train-slurm.sbatch").read_text()
    assert re.findall(r"^(\w+)=\$\{(\d)", recipe, re.M) == [("PROFILE", "1"), ("DATA", "2"), ("RUN", "3")]

"""Starting ranks: `--nproc N` relaunches the same command under torchrun; under SLURM (one task per GPU,
`srun`), the SLURM variables become torch.distributed's."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

NPROC_FLAG = "--nproc"


def under_launcher() -> bool:
    """True inside a torchrun (or SLURM-mapped) worker."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def slurm_to_torch_env() -> bool:
    """Map SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID to RANK/WORLD_SIZE/LOCAL_RANK when srun started us
    and torchrun did not. MASTER_ADDR/MASTER_PORT come from the batch script (commands/train-slurm.sbatch).
    Returns whether it did."""
    env = os.environ
    if under_launcher() or "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return False
    env["RANK"], env["WORLD_SIZE"] = env["SLURM_PROCID"], env["SLURM_NTASKS"]
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    env.setdefault("MASTER_PORT", "29500")
    if "MASTER_ADDR" not in env:
        raise RuntimeError(
            "SLURM run without MASTER_ADDR: export it in the batch script (see commands/train-slurm.sbatch)"
        )
    return True


def relaunch_under_torchrun(nproc: int, argv: Sequence[str] | None = None) -> int:
    """Run this same command line again as `nproc` local workers under torchrun and wait for them.
    The `--nproc` option is dropped from the workers' arguments so they do not relaunch again."""
    args = list(sys.argv[1:] if argv is None else argv)
    cleaned: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == NPROC_FLAG:
            skip = True
            continue
        if arg.startswith(NPROC_FLAG + "="):
            continue
        cleaned.append(arg)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "vidforge.cli.app",
        *cleaned,
    ]
    return subprocess.call(command)


def start_ranks(nproc: int | None, world_size: int | None = None) -> int | None:
    """What a command with `--nproc` does first. Outside a launcher, with --nproc given: check it against
    the layout's `world_size` (commands that have one) and run the command again under torchrun,
    returning its exit code for the caller to exit with. Otherwise (a worker, or no --nproc): map SLURM's
    variables if srun started us, and return None: go on in this process."""
    if nproc is not None and not under_launcher():
        if world_size is not None and nproc != world_size:
            from vidforge.errors import UserInputError

            raise UserInputError(
                f"--nproc {nproc}: the profile's layout needs {world_size} rank(s); "
                f"set cluster.cpu_processes (or gpus_per_node) to {nproc}, or change --nproc"
            )
        if nproc > 1 or world_size is not None:
            return relaunch_under_torchrun(nproc)
    slurm_to_torch_env()
    return None

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

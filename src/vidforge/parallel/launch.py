"""Starting ranks, in one place.

`--nproc N` alone is enough: the profile is loaded with a one-node world of N ranks (`nproc_overrides`),
and the same command runs again as N local workers started in this process by torch's elastic launcher
(what torchrun uses). Workers keep `--nproc` on their command line, so they load the same profile; they
see torchrun's RANK/WORLD_SIZE and do not launch again. A worker that fails writes what went wrong to a
file per rank (`report_failure`) instead of printing it; the parent reads them and raises one error, so a
user error in any rank is one line on stderr once and exit 2, as in a single process.

External launchers keep working: under `torchrun ... vidforge train` the variables are already there;
under SLURM (one task per GPU, `srun`) the SLURM variables become torch.distributed's. A run started with
the wrong number of ranks is told the command that starts the profile's (`start_advice`, by
`cluster.launcher`)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vidforge.files import write_text
from vidforge.profile.overrides import Override, as_overrides

if TYPE_CHECKING:
    from vidforge.profile.cluster import Cluster

# Set by the parent for its workers: the folder where a failing rank writes `rank<N>.json`.
REPORTS_ENV = "VIDFORGE_RANK_REPORTS"


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


def nproc_overrides(nproc: int | None) -> list[Override]:
    """Profile overrides that make the world `nproc` ranks on this one node. Both per-node counts are set:
    the accelerator kind (which of them counts) may itself come from the profile or another override."""
    if nproc is None:
        return []
    return as_overrides({"cluster.nodes": 1, "cluster.cpu_processes": nproc, "cluster.gpus_per_node": nproc})


def start_advice(cluster: Cluster, ranks: int) -> str:
    """How to start `ranks` ranks of this profile, the way its `cluster.launcher` says they start: what a
    run that started another number of them tells the user to do."""
    here = f"--nproc {ranks}"
    nodes, per_node = cluster.nodes, cluster.devices_per_node
    if cluster.launcher == "torchrun":
        return (
            f"start them with `torchrun --nnodes {nodes} --nproc-per-node {per_node} -m vidforge ...` on each "
            f"node (cluster.launcher=torchrun), or {here} on one machine"
        )
    if cluster.launcher == "slurm":
        return (
            f"start them with srun, one task per device on {nodes} node(s) (`sbatch --nodes={nodes} "
            f"commands/train-slurm.sbatch PROFILE LATENTS RUN`; cluster.launcher=slurm), or {here} on one machine"
        )
    return f"use {here}"


class RanksFailed(RuntimeError):
    """A worker failed with something other than a user error (its message, or its exit code)."""


def start_ranks(nproc: int | None) -> int | None:
    """What a command with `--nproc` does first. Outside a launcher, with --nproc given: run this command
    line as `nproc` local workers and wait for them; returns 0 when they all succeeded (the caller exits),
    raises UserInputError or RanksFailed with the first failing rank's message otherwise. Inside a worker,
    or without --nproc: map SLURM's variables if srun started us, and return None: go on here."""
    if nproc is not None and not under_launcher():
        launch_workers(nproc, sys.argv[1:])
        return 0
    slurm_to_torch_env()
    return None


def launch_workers(nproc: int, argv: Sequence[str]) -> None:
    """Run `python -m vidforge ARGV` as `nproc` local ranks (c10d rendezvous on a free local port)."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
    )
    # The elastic agent logs every start and (as ERROR, with a traceback) every failed worker; the
    # failure is reported below as one line instead.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="vidforge-ranks-") as reports:
        previous = os.environ.get(REPORTS_ENV)
        os.environ[REPORTS_ENV] = reports  # the workers inherit this process's environment
        try:
            elastic_launch(config, sys.executable)("-m", "vidforge", *argv)
        except ChildFailedError as err:
            raise _first_failure(Path(reports), err) from None
        except SignalException as err:
            # The agent passed the signal on to the workers and waited for them (a training run saves
            # a checkpoint first): say what they said, as a single process would.
            if err.sigval == signal.SIGINT:
                raise KeyboardInterrupt from None
            raise _first_failure(Path(reports), err) from None
        finally:
            if previous is None:
                os.environ.pop(REPORTS_ENV, None)
            else:
                os.environ[REPORTS_ENV] = previous


def announces_the_run() -> bool:
    """Whether this process announces the command (`--json`'s start event): a single process, the parent
    of `--nproc` workers, or rank 0 under an external launcher; not the parent's workers."""
    if os.environ.get(REPORTS_ENV) and under_launcher():
        return False
    return is_rank_zero()


def is_rank_zero() -> bool:
    """Rank 0 of a launched run, or a single process (known before any process group starts)."""
    return os.environ.get("RANK", "0") == "0"


def report_failure(kind: str, message: str) -> bool:
    """In a worker the parent launched: record this rank's failure for the parent to print, and return
    True (the caller prints nothing). Elsewhere (one process, torchrun, SLURM) return False."""
    folder = os.environ.get(REPORTS_ENV)
    if not folder or not under_launcher():
        return False
    rank = int(os.environ["RANK"])
    write_text(Path(folder, f"rank{rank}.json"), json.dumps({"rank": rank, "kind": kind, "message": message}))
    return True


def _first_failure(reports: Path, err: Exception) -> Exception:
    """The error to raise in the parent: a user error if any rank had one (they usually all do, the same),
    else the lowest rank's failure. A rank killed without a report (a crash, or stopped because another
    rank failed) is named by its exit code."""
    from vidforge.errors import Terminated, UserInputError

    found = sorted((json.loads(p.read_text()) for p in reports.glob("rank*.json")), key=lambda r: r["rank"])
    user = [r for r in found if r["kind"] == "user"]
    if user:
        return UserInputError(user[0]["message"])
    terminated = [r for r in found if r["kind"] == "terminated"]
    if terminated:
        return Terminated(terminated[0]["message"])
    if getattr(err, "sigval", None) is not None:  # signalled before any rank could stop cleanly
        return Terminated(f"terminated by {signal.Signals(err.sigval).name} before a checkpoint was saved")
    if found:
        first = found[0]
        return RanksFailed(f"rank {first['rank']}: {first['message']}")
    failures = getattr(err, "failures", {}) or {}
    codes = ", ".join(f"rank {rank} exit code {f.exitcode}" for rank, f in sorted(failures.items()))
    return RanksFailed(f"a worker failed without a report ({codes or err})")

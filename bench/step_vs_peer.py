"""vidforge's whole training step against the simplest alternative a user has, on the same weights, part by
part: diffusers' `WanTransformer3DModel` in a plain loop (forward, MSE against a random target, backward,
AdamW), the peer of the GPU suite's train pair (bench/gpu/peer_wan.py), here on the CPU at a small Wan shape.

    python bench/step_vs_peer.py [--rounds 9] [--packing] [--precision fp32|bf16] [--json OUT]

vidforge's step is `vidforge bench train`'s (`BenchStep`: `vidforge train`'s build and TrainStep on a fixed
synthetic batch): the loss's draws, the model, the loss, backward, clipping, AdamW, the EMA. Its parts are the
profiler ranges TrainStep names (`step.draw`, `step.model`, ...); the peer's are named here the same way.

What it prints, each vidforge / peer:
- the whole step's time, interleaved round by round (the order alternates; this machine is shared, so the
  fastest round of each is the figure, the median beside it);
- per part (model = forward + backward, loss = draws + reduction, optimizer = AdamW + zero_grad, clip, EMA,
  the rest = the step less its parts: syncs, bookkeeping): CPU time from one profiled round per step and
  the number of aten ops that do work on data (each at least one kernel on a GPU; views are not counted);
- the bytes autograd saves in one forward (activation memory), by `vidforge.bench.measure.saved_activations`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from vidforge.bench.measure import saved_activations
from vidforge.bench.train_bench import BenchStep
from vidforge.profile import load_profile

# The CPU proxy of the GPU suite's 1.3B pair: Wan's network at 3 blocks, hidden 256, 2 heads of 128, a
# 4 x 24 x 24 latent (576 tokens after 1x2x2 patches) and a 32-token caption.
PROXY = {
    "model.preset": "wan2.1-1.3b",
    "diffusion.objective": "flow",
    "model.layers": 3,
    "model.hidden": 256,
    "model.heads": 2,
    "model.mlp_hidden": 1024,
    "model.text_dim": 64,
    "cluster.accelerator": "cpu",
    "bench.latent_frames": 4,
    "bench.latent_height": 24,
    "bench.latent_width": 24,
    "bench.text_tokens": 32,
}
PARTS = {  # part -> the profiler ranges it adds up, vidforge's and the peer's
    "model": (("step.model", "step.backward"), ("peer.model", "peer.backward")),
    "loss": (("step.draw", "step.loss"), ("peer.loss",)),
    "optimizer": (("step.optimizer", "step.zero_grad"), ("peer.optimizer", "peer.zero_grad")),
    "clip": (("step.clip",), ()),
    "ema": (("step.ema",), ()),
}


class PeerStep:
    """diffusers' Wan with vidforge's weights, stepped as bench/gpu/peer_wan.py steps it."""

    def __init__(self, ours: torch.nn.Module, cfg, precision: str, fused: bool) -> None:
        from diffusers import WanTransformer3DModel

        from vidforge.families.wan.weights import diffusers_config

        # the config vidforge's export writes for this model section
        self.model = WanTransformer3DModel.from_config(diffusers_config(cfg))
        self.model.load_state_dict(ours.state_dict(), strict=True)  # the same names: the same weights
        self.model.train()
        # peer_wan.py's loop: fused AdamW on CUDA, torch's default elsewhere (unless told otherwise)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=fused or None)
        self.autocast = precision == "bf16"

    def inputs(self, latent: tuple[int, int, int], text_tokens: int, channels: int, text_dim: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(1, channels, *latent, generator=g)
        self.text = torch.randn(1, text_tokens, text_dim, generator=g)
        self.timestep = torch.randint(0, 1000, (1,), generator=g)
        self.target = torch.randn(self.x.shape, generator=g)

    def forward(self) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            return self.model(self.x, self.timestep, self.text, return_dict=False)[0]

    def __call__(self) -> None:
        with record_function("peer.model"):
            out = self.forward()
        with record_function("peer.loss"):
            loss = torch.nn.functional.mse_loss(out.float(), self.target)
        with record_function("peer.backward"):
            loss.backward()
        with record_function("peer.optimizer"):
            self.optimizer.step()
        with record_function("peer.zero_grad"):
            self.optimizer.zero_grad(set_to_none=True)


def interleaved(a, b, rounds: int, clock=time.perf_counter) -> tuple[list[float], list[float]]:
    """Seconds of `a()` and `b()` by `clock`, one call each per round, the order alternating."""
    times: tuple[list[float], list[float]] = ([], [])
    for r in range(rounds):
        order = ((0, a), (1, b)) if r % 2 == 0 else ((1, b), (0, a))
        for i, fn in order:
            started = clock()
            fn()
            times[i].append(clock() - started)
    return times


def launches_work(name: str) -> bool:
    """Whether an aten op does work on the data (a kernel on a GPU), rather than make a view of it or
    detach it: ops whose every result aliases an input (view, transpose, select, detach ...) do not."""
    packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None)
    if packet is None:
        return True
    schemas = [getattr(packet, o)._schema for o in packet.overloads()]
    return not all(
        s.returns and all(r.alias_info is not None and not r.alias_info.is_write for r in s.returns)
        for s in schemas
    )


def profiled_parts(fn, steps: int) -> tuple[dict[str, float], dict[str, int], float]:
    """Per profiler range over `steps` calls: CPU seconds and top-level aten ops (an op counts once, not
    with the ops it calls, views and detaches not counted); and the seconds of the whole calls."""
    seconds: dict[str, float] = defaultdict(float)
    ops: dict[str, int] = defaultdict(int)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        for _ in range(steps):
            with record_function("whole"):
                fn()
        whole = time.perf_counter() - started
    for event in prof.events():
        if event.name.startswith(("step.", "peer.")):
            seconds[event.name] += event.cpu_time_total / 1e6
        if not event.name.startswith("aten::") or not launches_work(event.name):
            continue
        parent, label, nested = event.cpu_parent, "rest", False
        while parent is not None:
            if parent.name.startswith("aten::"):
                nested = True
                break
            if parent.name.startswith(("step.", "peer.")):
                label = parent.name
                break
            parent = parent.cpu_parent
        if not nested:
            ops[label] += 1
    return {k: v / steps for k, v in seconds.items()}, {k: v // steps for k, v in ops.items()}, whole / steps


def saved_bytes(model: torch.nn.Module, forward) -> int:
    with saved_activations(model) as found:
        out = forward()
    size = found.bytes
    del out
    return size


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument(
        "--packing", action="store_true", help="vidforge packs the clip in one row (the GPU suite's)"
    )
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument(
        "--peer-fused",
        action="store_true",
        help="the peer's AdamW fused too (vidforge's is wherever torch has the kernel; on the GPU both are)",
    )
    ap.add_argument("--set", action="append", default=[], help="more profile overrides for vidforge's side")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared machine one thread's CPU time is the steadiest figure)",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    sets = {**PROXY, "train.precision": args.precision, "data.packing": args.packing}
    profile_ = load_profile("dit1b_1xh200", [f"{k}={v}" for k, v in sets.items()] + args.set)
    torch.manual_seed(0)
    ours = BenchStep(profile_)
    model = ours.parts.modules[0]
    cfg = profile_.model
    peer = PeerStep(model, cfg, args.precision, args.peer_fused)
    latent = (profile_.bench.latent_frames, profile_.bench.latent_height, profile_.bench.latent_width)
    peer.inputs(latent, profile_.bench.text_tokens, cfg.in_channels, cfg.text_dim)

    for _ in range(2):  # warm-up: allocator, the optimizers' states
        ours()
        peer()
    t_ours, t_peer = interleaved(ours, peer, args.rounds)
    cpu_ours, cpu_peer = interleaved(ours, peer, args.rounds, time.process_time)
    parts_ours = profiled_parts(ours, 3)
    parts_peer = profiled_parts(peer, 3)

    inputs = ours.step.loss.draw(ours.batches[0], ours.device)
    dtype = ours.parts.compute_dtype

    def our_forward():
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            return model(inputs.x, **inputs.model_kwargs)

    saved = (saved_bytes(model, our_forward), saved_bytes(peer.model, peer.forward))

    result = {
        "shape": sets,
        "step_s": {"vidforge": min(t_ours), "peer": min(t_peer)},
        "step_median_s": {"vidforge": statistics.median(t_ours), "peer": statistics.median(t_peer)},
        "ratio_fastest": min(t_ours) / min(t_peer),
        "ratio_median": statistics.median(t_ours) / statistics.median(t_peer),
        "cpu_s": {"vidforge": min(cpu_ours), "peer": min(cpu_peer)},
        "ratio_cpu": min(cpu_ours) / min(cpu_peer),
        "saved_bytes": {"vidforge": saved[0], "peer": saved[1]},
        "parts": {},
    }
    sec_o, ops_o, whole_o = parts_ours
    sec_p, ops_p, whole_p = parts_peer
    for part, (mine, theirs) in PARTS.items():
        result["parts"][part] = {
            "s": (sum(sec_o.get(n, 0.0) for n in mine), sum(sec_p.get(n, 0.0) for n in theirs)),
            "ops": (sum(ops_o.get(n, 0) for n in mine), sum(ops_p.get(n, 0) for n in theirs)),
        }
    named_o = sum(v[0] for v in (p["s"] for p in result["parts"].values()))
    named_p = sum(v[1] for v in (p["s"] for p in result["parts"].values()))
    result["parts"]["rest"] = {
        "s": (whole_o - named_o, whole_p - named_p),
        "ops": (ops_o.get("rest", 0), ops_p.get("rest", 0)),
    }
    result["ops_total"] = (sum(ops_o.values()), sum(ops_p.values()))

    print(
        f"whole step ({args.precision}, packing={args.packing}, peer AdamW fused={args.peer_fused}, "
        f"{args.threads} thread(s), {args.rounds} interleaved rounds): vidforge "
        f"{result['step_s']['vidforge']:.4f} s, peer {result['step_s']['peer']:.4f} s (fastest), ratio "
        f"{result['ratio_fastest']:.3f} (median {result['ratio_median']:.3f}); CPU time (fastest) "
        f"{result['cpu_s']['vidforge']:.4f} s vs {result['cpu_s']['peer']:.4f} s, ratio {result['ratio_cpu']:.3f}"
    )
    print(
        f"{'part':<10} {'vidforge s':>11} {'peer s':>9} {'vidforge ops':>13} {'peer ops':>9}  (one profiled step)"
    )
    for part, row in result["parts"].items():
        print(f"{part:<10} {row['s'][0]:>11.4f} {row['s'][1]:>9.4f} {row['ops'][0]:>13} {row['ops'][1]:>9}")
    print(f"{'all ops':<10} {'':>11} {'':>9} {result['ops_total'][0]:>13} {result['ops_total'][1]:>9}")
    print(
        f"saved for backward: vidforge {saved[0] / 2**20:.2f} MiB, peer {saved[1] / 2**20:.2f} MiB "
        f"({saved[0] / saved[1]:.3f}x)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()

"""Which kernel SDPA runs for each attention call of `vidforge bench train`'s step: one whole training
step (the model's forward and backward, with the profile's recompute) under torch.profiler, after one
untimed step. torch's SDPA dispatcher picks an implementation per call (cuDNN, flash, memory-efficient,
math; on the CPU its own flash kernel or math); the implementation's aten op names it, and on CUDA the
GPU kernels launched under that op name the kernel itself.

    python bench/gpu/sdpa_kernels.py --profile dit1b_1xh200 --set model.preset=wan2.1-1.3b ...

Prints one JSON object: {"device", "calls": [{phase, implementation, op, query, key, bias, count,
kernels}]}, one entry per distinct (op, input shapes), forward and backward apart (with full recompute
each forward runs twice). The math fallback has a forward op (`aten::_scaled_dot_product_attention_math`)
but no backward op of its own (autograd differentiates its matmuls and softmax), so it shows as forward
entries only.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

# The aten ops SDPA's dispatcher ends in, by implementation (torch 2.9 - 2.11 names).
IMPLEMENTATIONS = {
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_fused_attention_overrideable": "fused (backend's own)",
    "aten::_scaled_dot_product_attention_math": "math",
}


def implementation_of(op: str) -> tuple[str, str] | None:
    """(implementation, phase) of an SDPA aten op name, or None for any other op."""
    base, backward = op, False
    if op.endswith("_backward"):
        base, backward = op.removesuffix("_backward"), True
    impl = IMPLEMENTATIONS.get(base)
    return None if impl is None else (impl, "backward" if backward else "forward")


def _kernels(event) -> list[str]:
    """Device kernels launched under a profiler event and its descendants."""
    names = [k.name for k in getattr(event, "kernels", [])]
    for child in event.cpu_children:
        names += _kernels(child)
    return names


def sdpa_calls(events) -> list[dict]:
    """Group the SDPA implementation ops of profiler `events` by (op, query shape, key shape, bias)."""
    groups: Counter = Counter()
    kernels: dict[tuple, Counter] = {}
    for event in events:
        found = implementation_of(event.name)
        if found is None:
            continue
        shapes = list(event.input_shapes or [])
        # forward ops: (query, key, value, [attn_bias], ...); backward ops: (grad_out, query, key, ...)
        offset = 1 if found[1] == "backward" else 0
        query = tuple(shapes[offset]) if len(shapes) > offset else ()
        key = tuple(shapes[offset + 1]) if len(shapes) > offset + 1 else ()
        bias = found[1] == "forward" and len(shapes) > 3 and bool(shapes[3])
        group = (*found, event.name, query, key, bias)
        groups[group] += 1
        kernels.setdefault(group, Counter()).update(_kernels(event))
    return [
        {
            "implementation": impl,
            "phase": phase,
            "op": op,
            "query": list(query),
            "key": list(key),
            "bias": bias,
            "count": count,
            "kernels": [name for name, _ in kernels[(impl, phase, op, query, key, bias)].most_common(3)],
        }
        for (impl, phase, op, query, key, bias), count in sorted(
            groups.items(), key=lambda g: (g[0][1] != "forward", g[0][0], g[0][3], g[0][4])
        )
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="section.field=value")
    args = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from vidforge.bench.train_bench import BenchStep
    from vidforge.profile import load_profile

    resolved = load_profile(args.profile, args.sets)
    step = BenchStep(resolved)  # vidforge train's own build and step, on the synthetic batch
    step()  # untimed: kernel selection, autotuning, allocator warm-up happen here
    activities = [ProfilerActivity.CPU]
    if step.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize(step.device)
    with profile(activities=activities, record_shapes=True) as prof:
        step()
        if step.device.type == "cuda":
            torch.cuda.synchronize(step.device)
    report = {
        "device": torch.cuda.get_device_name(step.device) if step.device.type == "cuda" else "cpu",
        "sdpa_backend": resolved.model.sdpa_backend,
        "attention": resolved.model.attention,
        "calls": sdpa_calls(prof.events()),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()

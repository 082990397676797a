"""Issue 48's rows: whether vidforge is ahead of the peers, and every path that landed without a GPU
measured once. Each row beside its anchor from the same run (or a published figure, named as such):

    train_auto     the 1.3B step with train.activation_checkpointing=auto (compiled) against diffusers'
                   compiled step with full recompute (the peer's only choice); goal <= 0.85x
    stack_14b      a 14B-width block stack (Wan2.1-14B's block, a few layers) at 37,440 tokens in TFLOP/s
                   per GPU against Megatron-Bridge's published 325.77 (goal >= 330), and float8 training
                   (train.fp8, rowwise, compiled) against the same stack in bf16 (goal >= 1.2x)
    distill        a distilled student's seconds per video (its few-step calls, no guidance) against its
                   teacher's (the published 50 guided steps); goal >= 8x
    fp8_compile    the CUDA check `[fp8+compile]`, never reached in a run so far
    wan22          Wan2.2 TI2V-5B and Wan2.1-I2V-14B (LoRA) steps at their published shapes, against the
                   planner's predicted step time
    sparse         sliding-tile and video sparse attention (flex) against dense cuDNN, the 1.3B step at
                   32K tokens
    swap_offload   block swap and checkpoint offload (a LoRA of the 1.3B) against the planner's prediction

As in measure_steps.py, vidforge runs through its command line in subprocesses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import measure_steps as m
from report import Context, Row

MEGATRON_14B_TFLOPS = 325.77
"""Megatron-Bridge, Wan2.1-14B at 37,440 tokens, TFLOP/s per H100 (examples/models/wan/performance-summary.md)."""
WAN14B = {"model.hidden": 5120, "model.heads": 40, "model.mlp_hidden": 13824}


def _train_args(ctx: Context, latent, recompute: str, pairs: dict[str, object] | None = None) -> list[str]:
    sets = m.bench_sets(ctx, latent, recompute) + m._sets(pairs or {})
    return ["bench", "train", "--profile", m.PROFILE, *sets]


def _tiny(ctx: Context, pairs: dict[str, object]) -> dict[str, object]:
    """The smoke run's stand-in for a published width: the peer pair's tiny block."""
    if ctx.smoke:
        pairs.update({f"model.{k}": v for k, v in m.SMOKE_PEER_OVERRIDES["vidforge"].items()})
    return pairs


def _planned_step(ctx: Context, args: list[str]) -> dict:
    """`vidforge bench plan` of the same profile and settings a `bench train` run takes."""
    sets = args[args.index("--profile") :]
    return m.vidforge(["bench", "plan", *sets], ctx)


def _tflops(result: dict) -> float:
    return result["flops_per_step"] / result["step_time_s"] / result["world_size"] / 1e12


def train_auto(ctx: Context, work: Path) -> Iterator[Row]:
    """The 1.3B step at the benchmark shape with auto recompute against diffusers' compiled step with full
    recompute (eager in the CPU smoke run: inductor's C++ build takes minutes there)."""
    s, compiled = ctx.shapes, not ctx.smoke
    ours = m.vidforge(_train_args(ctx, s.latent, "auto", {"train.compile": compiled}), ctx)
    label = "compiled" if compiled else "eager"
    theirs = m.peer("train", ctx, s.latent, "full", compiled)
    note = f"goal <= 0.85x; recompute {ours['recompute']}; {ours['workload']}"
    anchor = f"diffusers Wan, full recompute ({label})"
    yield Row("train_auto", f"step time (auto recompute, {label})", ours["step_time_s"], "s", anchor,
              theirs["step_time_s"], note)  # fmt: skip
    yield Row("train_auto", f"MFU (auto recompute, {label})", ours["mfu"], "", anchor, theirs["mfu"], note)
    yield Row("train_auto", "peak memory (auto recompute)", ours["peak_memory_gib"], "GiB", "memory model",
              ours["predicted_measured_terms_gib"], ours["peak_memory_method"])  # fmt: skip


def stack_14b(ctx: Context, work: Path) -> Iterator[Row]:
    """Wan2.1-14B's block, `stack_layers` of them, at `stack_latent`, compiled with auto recompute: TFLOP/s
    per GPU (model FLOPs) against Megatron-Bridge's published figure, then the same with float8 training
    (CUDA with compute capability >= 8.9 only: the CPU smoke run says so in its row)."""
    s, compiled = ctx.shapes, not ctx.smoke
    pairs = _tiny(ctx, {**WAN14B, "model.layers": s.stack_layers, "train.compile": compiled})
    bf16 = m.vidforge(_train_args(ctx, s.stack_latent, "auto", pairs), ctx)
    note = f"{bf16['workload']}; {s.stack_layers} layers; recompute {bf16['recompute']}; goal >= 330"
    yield Row("stack_14b", "TFLOP/s per GPU (bf16, compiled)", _tflops(bf16), "TFLOP/s",
              "Megatron-Bridge Wan2.1-14B, H100 (published)", MEGATRON_14B_TFLOPS, note)  # fmt: skip
    if ctx.smoke:
        yield Row(
            "stack_14b", "float8 training step", None, note="not on the CPU: train.fp8 needs CUDA >= 8.9"
        )
        return
    fp8 = m.vidforge(_train_args(ctx, s.stack_latent, "auto", {**pairs, "train.fp8": True}), ctx)
    yield Row("stack_14b", "step time, float8 training (rowwise, compiled)", fp8["step_time_s"], "s",
              "the same stack in bf16", bf16["step_time_s"], "goal: bf16 / float8 >= 1.2")  # fmt: skip
    yield Row("stack_14b", "TFLOP/s per GPU (float8, compiled)", _tflops(fp8), "TFLOP/s",
              "Megatron-Bridge Wan2.1-14B, H100 (published)", MEGATRON_14B_TFLOPS, fp8["workload"])  # fmt: skip


def distill(ctx: Context, work: Path) -> Iterator[Row]:
    """A distilled student's seconds per video against its teacher's, from one `bench infer` run of the
    network both share (the student is the teacher's architecture): the student makes `student_calls`
    calls of one row (no guidance), the teacher `teacher_steps` calls of the guided doubled batch, each
    at the per-call time measured here (the VAE decode, the same for both, left out)."""
    from vidforge.profile import load_profile

    s = ctx.shapes
    sets = m.bench_sets(ctx, s.latent, "none") + m._sets(
        {"infer.batch_size": 1, "diffusion.steps": s.infer_steps}
    )
    sampler = load_profile(m.PROFILE, [a for a in sets if a != "--set"]).diffusion.sampler
    args = ["bench", "infer", "--profile", m.PROFILE, *sets, "--sampler", sampler]
    result = m.vidforge([*args, "--guidance", "batched", "--guidance", "sequential"], ctx)
    per_call = {r["rows_per_call"]: r["per_model_call_s"] for r in result["rows"]}
    student, teacher = s.student_calls * per_call[1], s.teacher_steps * per_call[2]
    note = (
        f"student {s.student_calls} calls x {per_call[1]:.4g} s, teacher {s.teacher_steps} guided calls x "
        f"{per_call[2]:.4g} s ({sampler}); goal: teacher / student >= 8"
    )
    yield Row("distill", "seconds per video, distilled student", student, "s", "its teacher", teacher, note)


def fp8_compile(ctx: Context, work: Path) -> Iterator[Row]:
    """The CUDA check of float8 training under compile, on its own, so that it is reached."""
    test = "tests/gpu/test_train_cli_cuda.py::test_bf16_compile_and_fp8_train_close_to_fp32[fp8+compile]"
    yield from m.pytest_rows(ctx, work, [test], "fp8_compile")


def wan22(ctx: Context, work: Path) -> Iterator[Row]:
    """Wan2.2 TI2V-5B (full fine-tune) and Wan2.1-I2V-14B (LoRA, the whole depth) training steps at their
    published shapes with auto recompute, against the step `bench plan` predicts for the same settings."""
    s = ctx.shapes
    cases = {
        "TI2V-5B": (s.ti2v_latent, {"model.preset": "wan2.2-ti2v-5b", "diffusion.image_condition": 0.5}),
        "I2V-14B LoRA": (
            s.i2v_latent,
            {
                "model.preset": "wan2.1-14b", **WAN14B, "model.image_dim": 1280, "model.condition_channels": 20,
                "train.lora": f"{{rank: {s.i2v_lora_rank}}}",
            },
        ),
    }  # fmt: skip
    for name, (latent, pairs) in cases.items():
        args = _train_args(ctx, latent, "auto", _tiny(ctx, dict(pairs)))
        ours = m.vidforge(args, ctx)
        plan = _planned_step(ctx, args)
        note = f"{ours['workload']}; recompute {ours['recompute']}; peak {ours['peak_memory_gib']:.4g} GiB"
        yield Row("wan22", f"{name} step time", ours["step_time_s"], "s", "bench plan's prediction",
                  plan["step_s"], note)  # fmt: skip


def sparse(ctx: Context, work: Path) -> Iterator[Row]:
    """The 1.3B step at the benchmark shape (full recompute, as the train pair) with sliding-tile and
    with video sparse attention on flex, against the dense step on SDPA (cuDNN on the GPU)."""
    s = ctx.shapes
    dense = m.vidforge(m.train_args(ctx, s.latent), ctx)
    # flex has no backward on the CPU: the smoke run takes SDPA's exact masked reference of each pattern
    flex = {"model.attention": "sdpa" if ctx.smoke else "flex", "model.attention_tile": s.sparse_tile}
    cases = {
        f"sliding-tile {list(s.sparse_window)}": {**flex, "model.attention_window": s.sparse_window},
        f"video sparse top-{s.sparse_topk}": {**flex, "model.attention_topk": s.sparse_topk},
    }
    for name, pairs in cases.items():
        ours = m.vidforge(_train_args(ctx, s.latent, s.recompute, pairs), ctx)
        skipped = ours["skipped_attention_flops_per_step"] / max(dense["flops_per_step"], 1)
        note = f"{ours['workload']}; attention FLOPs skipped: {skipped:.1%} of the dense step's FLOPs"
        yield Row("sparse", f"{name} step time ({flex['model.attention']})", ours["step_time_s"], "s", "dense SDPA step",
                  dense["step_time_s"], note)  # fmt: skip


def swap_offload(ctx: Context, work: Path) -> Iterator[Row]:
    """A LoRA step of the 1.3B with `swap_blocks` blocks' frozen weights in host memory, then with full
    recompute and the checkpointed blocks' inputs offloaded too, each against the step `bench plan`
    predicts for the same settings (its copy time over the host link included)."""
    s = ctx.shapes
    lora = {"train.lora": "{rank: 16}", "train.lora.blocks_to_swap": s.swap_blocks}
    cases = {
        f"block swap ({s.swap_blocks} blocks)": (s.recompute, lora),
        "block swap + checkpoint offload": ("full", {**lora, "train.checkpoint_offload": True}),
    }
    for name, (recompute, pairs) in cases.items():
        args = _train_args(ctx, s.latent, recompute, pairs)
        ours = m.vidforge(args, ctx)
        plan = _planned_step(ctx, args)
        note = f"{ours['workload']}; peak {ours['peak_memory_gib']:.4g} GiB (predicted {ours['predicted_measured_terms_gib']:.4g})"
        yield Row("swap_offload", f"{name} step time", ours["step_time_s"], "s", "bench plan's prediction",
                  plan["step_s"], note)  # fmt: skip

"""The suite's steps. Each takes the run's Context and a scratch folder and returns table rows; each
measurement comes with its anchor from the same run. vidforge runs through its command line
(`python -m vidforge.cli.app --json ...`), never through the training internals, so the suite measures
what a user runs and survives rewrites of those internals."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from report import Context, Row
from shapes import PEERS, SMOKE_PEER_OVERRIDES

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


class StepError(RuntimeError):
    """A subprocess of a step failed; the message is its last error line."""


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def _run(cmd: list[str], ctx: Context, timeout: float, cwd: Path = ROOT) -> str:
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=ctx.env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise StepError(f"{' '.join(cmd[1:4])}: no result within {timeout:.0f} s") from err
    if proc.returncode != 0:
        raise StepError(f"exit {proc.returncode}: {_last_line(proc.stderr or proc.stdout)}")
    return proc.stdout


_RESULTS: dict[tuple[str, ...], dict] = {}


def vidforge(args: list[str], ctx: Context, timeout: float = 600) -> dict:
    """Run `vidforge --json ARGS` and return its result line. A command already run in this suite run
    is not run again (the memory step's 32K point is the train step's eager run)."""
    key = (str(ctx.work), *args)
    if key not in _RESULTS:
        _RESULTS[key] = _vidforge(args, ctx, timeout)
    return _RESULTS[key]


def _vidforge(args: list[str], ctx: Context, timeout: float) -> dict:
    out = _run([sys.executable, "-m", "vidforge.cli.app", "--json", *args], ctx, timeout)
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            if data.get("event") == "result":
                return data
    raise StepError(f"vidforge {' '.join(args[:2])}: no result line in its output")


def json_of(stdout: str) -> dict:
    """The first JSON object a script printed (scripts may print a table after it)."""
    start = stdout.index("{")
    return json.JSONDecoder().raw_decode(stdout[start:])[0]


def _sets(pairs: dict[str, object]) -> list[str]:
    args: list[str] = []
    for key, value in pairs.items():
        text = (
            json.dumps(list(value))
            if isinstance(value, tuple | list)
            else str(value).lower()
            if isinstance(value, bool)
            else str(value)
        )
        args += ["--set", f"{key}={text}"]
    return args


def model_sets(ctx: Context) -> dict[str, object]:
    """vidforge's side of the peer pair: the preset of PEERS with Wan's objective (rectified flow), shrunk in
    the smoke run."""
    sets: dict[str, object] = {
        "model.preset": PEERS["wan-1.3b"]["vidforge_preset"],
        "diffusion.objective": "flow",
    }
    if ctx.smoke:
        sets.update({f"model.{k}": v for k, v in SMOKE_PEER_OVERRIDES["vidforge"].items()})
    return sets


def bench_sets(ctx: Context, latent: tuple[int, int, int], recompute: str) -> list[str]:
    """The profile of every vidforge bench run: dit1b_1xh200 on one device of the machine at hand."""
    s = ctx.shapes
    pairs: dict[str, object] = {
        "cluster.accelerator": s.accelerator,
        "cluster.gpus_per_node": 1,
        **model_sets(ctx),
        "bench.latent_frames": latent[0],
        "bench.latent_height": latent[1],
        "bench.latent_width": latent[2],
        "bench.text_tokens": s.text_tokens,
        "bench.warmup": s.warmup,
        "bench.repeats": s.repeats,
        "train.activation_checkpointing": recompute,
    }
    if ctx.smoke:
        pairs["train.precision"] = "fp32"
    return ["--profile", "dit1b_1xh200", *_sets(pairs)]


def peer(
    mode: str, ctx: Context, latent: tuple[int, int, int], recompute: str = "none", compile_: bool = False
) -> dict:
    """diffusers' WanTransformer3DModel at the same shape, in its own process (bench/gpu/peer_wan.py)."""
    s = ctx.shapes
    cmd = [
        sys.executable,
        str(HERE / "peer_wan.py"),
        mode,
        "--device", s.device,
        "--latent", *map(str, latent),
        "--text-tokens", str(s.text_tokens),
        "--warmup", str(s.warmup),
        "--repeats", str(s.repeats),
        "--recompute", recompute,
        "--accelerator", s.accelerator,
    ]  # fmt: skip
    if compile_:
        cmd.append("--compile")
    if ctx.smoke:
        cmd.append("--smoke")
    return json_of(_run(cmd, ctx, timeout=600))


# --- steps ------------------------------------------------------------------------------------------


def correctness(ctx: Context, work: Path) -> list[Row]:
    """`pytest -m gpu tests/gpu`: one row per test, passed / failed / skipped with the reason."""
    junit = work / "junit.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/gpu",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=ctx.env, capture_output=True, text=True, timeout=900)
    if not junit.exists():
        raise StepError(
            f"pytest wrote no report (exit {proc.returncode}): {_last_line(proc.stdout + proc.stderr)}"
        )
    rows = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, note = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error"}.get(tag, "skipped")
                note = (node.get("message") or "").splitlines()[0][:200] if node.get("message") else ""
        rows.append(Row("correctness", case.get("name", "?"), outcome, note=note))
    return rows


def matmul_tflops(ctx: Context, size: int = 8192) -> float:
    """The dense bf16 matrix-product rate of this device (random data; the median of 10): the ceiling that
    attention TFLOP/s are read against."""
    import torch

    from vidforge.bench.timing import time_calls

    device = torch.device(ctx.shapes.device)
    size = 256 if ctx.smoke else size
    dtype = torch.float32 if ctx.smoke else torch.bfloat16
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    median = time_calls(lambda: a @ b, 3, 10, device).median
    return 2 * size**3 / median / 1e12


def attention(ctx: Context, work: Path) -> list[Row]:
    """`vidforge bench attention` with the 1.3B model's heads, once per SDPA kernel on the GPU (cuDNN,
    flash); flex, dense and flash-attn come with the first run. Anchor: the bf16 matmul rate."""
    ceiling = matmul_tflops(ctx)
    anchor = "dense matmul (same device)"
    kernels = ["auto"] if ctx.smoke else ["cudnn", "flash"]
    rows = []
    for i, kernel in enumerate(kernels):
        pairs = {
            "cluster.accelerator": ctx.shapes.accelerator,
            "cluster.gpus_per_node": 1,
            **model_sets(ctx),
            "model.sdpa_backend": kernel,
            "bench.attention_seq_lens": list(ctx.shapes.attention_seq_lens),
            "bench.warmup": max(ctx.shapes.warmup, 1),
            "bench.repeats": ctx.shapes.repeats,
        }
        result = vidforge(["bench", "attention", "--profile", "dit1b_1xh200", *_sets(pairs)], ctx)
        for r in result["rows"]:
            if i > 0 and r["backend"] != "sdpa":
                continue  # the other backends do not depend on the SDPA kernel: measured once
            name = f"sdpa[{kernel}]" if r["backend"] == "sdpa" else r["backend"]
            for key, label in (("forward_tflops", "fwd"), ("forward_backward_tflops", "fwd+bwd")):
                rows.append(
                    Row(
                        "attention",
                        f"{name} {label} S={r['seq_len']}",
                        r[key],
                        "TFLOP/s",
                        anchor,
                        ceiling,
                        r["skipped"] or "",
                    )
                )
    return rows


def train(ctx: Context, work: Path) -> list[Row]:
    """The 1.3B training step at the benchmark shape, eager and compiled, beside diffusers' Wan of the
    same shape with the same recompute. The compiled pair is left out of the CPU smoke run (inductor's
    C++ build takes minutes on CPU)."""
    s = ctx.shapes
    rows = []
    for compiled in (False, True):
        label = "compiled" if compiled else "eager"
        if compiled and ctx.smoke:
            rows.append(
                Row(
                    "train",
                    f"step time ({label})",
                    None,
                    note="not in the CPU smoke run (inductor C++ build)",
                )
            )
            continue
        args = bench_sets(ctx, s.latent, s.recompute) + _sets({"train.compile": compiled})
        ours = vidforge(["bench", "train", *args], ctx)
        theirs = peer("train", ctx, s.latent, s.recompute, compiled)
        anchor = f"diffusers Wan ({label})"
        tokens = ours["tokens_per_step"]
        rows += [
            Row(
                "train",
                f"step time ({label}, {tokens} tokens)",
                ours["step_time_s"],
                "s",
                anchor,
                theirs["step_time_s"],
                ours["workload"],
            ),
            Row(
                "train",
                f"MFU ({label})",
                ours["mfu"],
                "",
                anchor,
                theirs["mfu"],
                "each model's own FLOPs (vidforge.models.flops)",
            ),
            Row(
                "train",
                f"peak memory ({label})",
                ours["peak_memory_gib"],
                "GiB",
                anchor,
                theirs["peak_memory_gib"],
                ours["peak_memory_method"],
            ),
        ]
        if not compiled:
            counts = (float(theirs["vidforge_parameters"]), float(theirs["parameters"]))
            rows.append(Row("train", "parameters", counts[0], "", "diffusers Wan", counts[1]))
    return rows


def infer(ctx: Context, work: Path) -> list[Row]:
    """The guided sampling step (one model call on the doubled batch of classifier-free guidance) of
    `vidforge bench infer`, beside diffusers' Wan forward on the same doubled batch."""
    s = ctx.shapes
    args = bench_sets(ctx, s.latent, "none") + _sets(
        {"infer.batch_size": 1, "diffusion.steps": s.infer_steps}
    )
    ours = vidforge(["bench", "infer", *args], ctx)
    theirs = peer("infer", ctx, s.latent)
    rows = []
    for r in ours["rows"]:
        anchor = "diffusers Wan, batch 2" if r["rows_per_call"] == 2 else ""
        rows.append(
            Row(
                "infer",
                f"{r['sampler']} {r['guidance']}: per model call",
                r["per_model_call_s"],
                "s",
                anchor,
                theirs["step_time_s"] if anchor else None,
                f"{r['model_calls']} calls of {r['rows_per_call']} row(s), {r['end_to_end_s']:.4g} s end to end",
            )
        )
    return rows


def memory(ctx: Context, work: Path) -> list[Row]:
    """The memory model's prediction (what `vidforge bench plan` says) beside the measured peak of the
    same training step, at each of the shapes' token counts."""
    rows = []
    for label, latent in ctx.shapes.memory_latents.items():
        ours = vidforge(["bench", "train", *bench_sets(ctx, latent, ctx.shapes.recompute)], ctx)
        rows.append(
            Row(
                "memory",
                f"peak at {label} tokens ({ctx.shapes.recompute} recompute)",
                ours["peak_memory_gib"],
                "GiB",
                "memory model",
                ours["predicted_measured_terms_gib"],
                ours["peak_memory_method"],
            )
        )
    return rows


def offload(ctx: Context, work: Path) -> list[Row]:
    """Activation offload (half the blocks, none recomputing) beside the same step keeping everything on
    the device, at the smaller memory shape (the larger would need ~90 GiB of pinned host memory): the
    step-time ratio says how much of the copying the side stream hides, the peak what it saves."""
    latent = next(iter(ctx.shapes.memory_latents.values()))
    plain = vidforge(["bench", "train", *bench_sets(ctx, latent, "none")], ctx)
    ours = vidforge(
        ["bench", "train", *bench_sets(ctx, latent, "none"), *_sets({"train.activation_offload": 0.5})], ctx
    )
    anchor = "no offload, no recompute"
    note = f"{plain['tokens_per_step']} tokens; half the blocks offloaded on a side stream with prefetch"
    return [
        Row("offload", "step time", ours["step_time_s"], "s", anchor, plain["step_time_s"], note),
        Row("offload", "peak memory", ours["peak_memory_gib"], "GiB", anchor, plain["peak_memory_gib"], note),
    ]


def caption(ctx: Context, work: Path) -> list[Row]:
    """bench/caption_annotations.py: clips/s of each caption annotation on this device, with the decode
    of the same clips as the anchor (what no annotation can beat)."""
    s = ctx.shapes
    clip_model, coca_model = s.caption_models
    cmd = [
        sys.executable, str(ROOT / "bench" / "caption_annotations.py"),
        "--clips", str(s.caption_clips),
        "--width", str(s.caption_size[0]), "--height", str(s.caption_size[1]),
        "--device", s.device, "--clip-model", clip_model, "--coca-model", coca_model,
    ]  # fmt: skip
    report = json_of(_run(cmd, ctx, timeout=900))
    timings = report["timings"]
    decode = timings.get("decode", {}).get("clips_per_s")
    return [
        Row(
            "caption",
            step,
            t["clips_per_s"],
            "clips/s",
            "decode (same clips)" if step != "decode" else "",
            decode if step != "decode" else None,
            f"{t['clips']} clips, {clip_model} / {coca_model}",
        )
        for step, t in timings.items()
    ]


def tokenize(ctx: Context, work: Path) -> list[Row]:
    """`vidforge shard` then `vidforge tokenize` with a Wan VAE (random weights, diffusers' format) on
    generated clips, beside the VAE's own encode of clips of the same size timed alone: what the
    pipeline around the encoder (decode, resize, prefetch, writing) costs."""
    import torch
    from diffusers import AutoencoderKLWan

    from vidforge.bench.timing import time_calls
    from vidforge.data.testing import make_annotated_dir

    s = ctx.shapes
    (h, w), frames = s.tokenize_size, s.tokenize_frames
    size = dict(videos=s.tokenize_clips, images=0, rejected=0, size=(h, w), frames=(frames, frames))
    annotated = make_annotated_dir(work / "annotated", **size)
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**s.vae)
    vae.save_pretrained(work / "vae")
    dtype = "float32" if ctx.smoke else "bfloat16"
    sets = _sets(
        {
            "cluster.accelerator": s.accelerator,
            "cluster.gpus_per_node": 1,
            "data.buckets": [[h, w]],
            "data.frame_buckets": [frames],
            "data.val_fraction": 0,
            "tokenizer.kind": "wan",
            "tokenizer.path": str(work / "vae"),
            "tokenizer.spatial_compression": 8,
            "tokenizer.dtype": dtype,
        }
    )
    vidforge(["shard", str(annotated), "-o", str(work / "shards"), *sets], ctx)
    ours = vidforge(["tokenize", str(work / "shards"), "-o", str(work / "latents"), *sets], ctx)

    device = torch.device(s.device)
    vae = vae.to(device, getattr(torch, dtype)).eval()
    clip = torch.rand(1, 3, frames, h, w, device=device, dtype=getattr(torch, dtype)) * 2 - 1

    @torch.no_grad()
    def encode() -> None:
        vae.encode(clip).latent_dist.mode()

    alone = 1 / time_calls(encode, max(s.warmup, 1), s.repeats, device).median
    anchor = "the VAE's encode alone"
    note = f"{ours['samples']} clips of {frames} x {h} x {w}, {dtype}"
    return [
        Row("tokenize", "vidforge tokenize end to end", ours["clips/s"], "clips/s", anchor, alone, note),
        Row(
            "tokenize",
            "vidforge tokenize, encode only",
            ours["encode clips/s"],
            "clips/s",
            anchor,
            alone,
            note,
        ),
    ]

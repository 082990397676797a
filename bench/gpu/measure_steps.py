"""The suite's steps. Each takes the run's Context and a scratch folder and yields table rows as it
measures them (the suite writes its files after every row, so a device command stopped at its limit
keeps what finished); each measurement comes with its anchor from the same run. vidforge runs through
its command line (`python -m vidforge.cli.app --json ...`), never through the training internals, so the
suite measures what a user runs and survives rewrites of those internals. Every subprocess gets at most
the time left before the context's deadline."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from report import Context, Row
from shapes import PEERS, SMOKE_PEER_OVERRIDES

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


CURATOR_CAPTION = 0.85  # clips/s: NeMo Curator's nightly caption + enhance benchmark, one 8-GPU node


class StepError(RuntimeError):
    """A subprocess of a step failed; the message is its last error line."""


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def _run(cmd: list[str], ctx: Context, timeout: float, cwd: Path = ROOT) -> str:
    timeout = ctx.time_left(timeout)
    if timeout <= 0:
        raise StepError(f"{' '.join(cmd[1:6])}: not started, the part's time budget is spent")
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=ctx.env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise StepError(f"{' '.join(cmd[1:6])}: no result within {timeout:.0f} s") from err
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


PROFILE = "dit1b_1xh200"


def bench_sets(ctx: Context, latent: tuple[int, int, int], recompute: str) -> list[str]:
    """The --set arguments of every vidforge bench run: PROFILE on one device of the machine at hand."""
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
    return _sets(pairs)


def train_args(ctx: Context, latent: tuple[int, int, int], compiled: bool = False) -> list[str]:
    """`vidforge bench train`'s arguments at `latent` with the shapes' recompute: one function for the
    train and memory steps, so the memory step's point at the train shape is the train step's run."""
    sets = bench_sets(ctx, latent, ctx.shapes.recompute) + _sets({"train.compile": compiled})
    return ["bench", "train", "--profile", PROFILE, *sets]


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


def correctness(ctx: Context, work: Path) -> Iterator[Row]:
    """`pytest -m gpu tests/gpu` in one pytest (over `shapes.test_workers` xdist workers, each test at
    most `shapes.test_timeout_s`): a row per test as it finishes (bench/gpu/pytest_rows.py), passed /
    failed / skipped with the reason and its seconds; tests that never finished (the part's deadline,
    a crash) get a row saying so."""
    yield from pytest_rows(ctx, work, ["tests/gpu"])


def pytest_rows(ctx: Context, work: Path, targets: list[str], step: str = "correctness") -> Iterator[Row]:
    """`correctness` of the pytest `targets` (paths or node ids under tests/gpu), rows named `step`."""
    s = ctx.shapes
    records = work / "tests.jsonl"
    # the failures' tracebacks: brought back beside the table
    log = (ctx.out or work) / ("pytest.log" if step == "correctness" else f"pytest-{step}.log")
    cmd = [sys.executable, "-m", "pytest", *targets, "-m", "gpu", "-q", "-rA", "-p", "no:cacheprovider"]
    cmd += ["-p", "pytest_rows", f"--timeout={s.test_timeout_s}"]
    if s.test_workers > 1 and importlib.util.find_spec("xdist") is not None:  # else one process
        cmd += ["-n", str(s.test_workers)]
    env = {**ctx.env, "VIDFORGE_GPU_SUITE_ROWS": str(records)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    limit = ctx.time_left(1800)
    with log.open("w") as out:
        # its own process group (not session: the device kills a command's leftover processes by
        # session), so that the deadline can stop pytest with its workers and the runs they started
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, process_group=0)
    collected: list[str] = []
    finished: set[str] = set()
    read = 0
    started = time.perf_counter()
    stopped = ""
    while True:
        done = proc.poll() is not None
        if records.exists():
            lines = records.read_text().split("\n")[:-1]  # whole lines only: the plugin may be mid-write
            for line in lines[read:]:
                record = json.loads(line)
                if "collected" in record:
                    collected = record["collected"]
                    continue
                finished.add(record["test"])
                note = f"{record['seconds']:.1f} s" + (f"; {record['message']}" if record["message"] else "")
                yield Row(step, record["test"].removeprefix("tests/gpu/"), record["outcome"], note=note)
            read = len(lines)
        if done:
            break
        if time.perf_counter() - started > limit:
            os.killpg(proc.pid, signal.SIGKILL)  # pytest, its xdist workers and the trainings they run
            proc.wait()
            stopped = f"pytest stopped after {limit:.0f} s (the part's time budget)"
        else:
            time.sleep(1)
    if not collected and not finished:
        if stopped:
            raise StepError(f"{stopped}, before any test finished")
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise StepError(f"pytest ran no test (exit {proc.returncode}): {tail[0][:300]}")
    why = stopped or f"pytest exited {proc.returncode} before it finished"
    for test in collected:
        if test not in finished:
            yield Row(step, test.removeprefix("tests/gpu/"), "not run", note=why)


def sdpa_kernels(ctx: Context, work: Path) -> Iterator[Row]:
    """Which SDPA implementation and GPU kernel each attention call of the train step gets (forward and
    backward; bench/gpu/sdpa_kernels.py profiles one `vidforge bench train` step at the train shape):
    what `model.sdpa_backend=auto` hands to torch's dispatcher, read back from the profiler."""
    sets = bench_sets(ctx, ctx.shapes.latent, ctx.shapes.recompute)
    cmd = [sys.executable, str(HERE / "sdpa_kernels.py"), "--profile", PROFILE]
    cmd += sets
    report = json_of(_run(cmd, ctx, timeout=600))
    if not report["calls"]:
        yield Row(
            "sdpa_kernels", "SDPA calls in one train step", 0, note=f"model.attention={report['attention']}"
        )
    for call in report["calls"]:
        shape = f"q {'x'.join(map(str, call['query']))}, k {'x'.join(map(str, call['key']))}"
        kernels = "; ".join(k[:80] for k in call["kernels"]) or "no device kernel (CPU)"
        note = f"{call['count']} calls, {call['op']}{', with a mask' if call['bias'] else ''}; {kernels}"
        yield Row("sdpa_kernels", f"{call['phase']} {shape}", call["implementation"], note=note)


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


def attention(ctx: Context, work: Path) -> Iterator[Row]:
    """`vidforge bench attention` with the 1.3B model's heads, once per SDPA kernel on the GPU (cuDNN,
    flash); flex, dense and flash-attn come with the first run. Anchor: the bf16 matmul rate."""
    ceiling = matmul_tflops(ctx)
    anchor = "dense matmul (same device)"
    kernels = ["auto"] if ctx.smoke else ["cudnn", "flash"]
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
        result = vidforge(["bench", "attention", "--profile", PROFILE, *_sets(pairs)], ctx)
        for r in result["rows"]:
            if i > 0 and r["backend"] != "sdpa":
                continue  # the other backends do not depend on the SDPA kernel: measured once
            name = f"sdpa[{kernel}]" if r["backend"] == "sdpa" else r["backend"]
            for key, label in (("forward_tflops", "fwd"), ("forward_backward_tflops", "fwd+bwd")):
                what = f"{name} {label} S={r['seq_len']}"
                yield Row("attention", what, r[key], "TFLOP/s", anchor, ceiling, r["skipped"] or "")


def _train(ctx: Context, compiled: bool) -> Iterator[Row]:
    """The 1.3B training step at the benchmark shape beside diffusers' Wan of the same shape with the
    same recompute; vidforge's rows come as soon as its run ends, the peer's ratio with the peer's."""
    s = ctx.shapes
    label = "compiled" if compiled else "eager"
    ours = vidforge(train_args(ctx, s.latent, compiled), ctx)
    try:
        theirs = peer("train", ctx, s.latent, s.recompute, compiled)
        error = ""
    except StepError as err:  # vidforge's rows stay, without an anchor, saying why
        theirs, error = {}, f"diffusers Wan failed: {err}"
    anchor = f"diffusers Wan ({label})"
    tokens = ours["tokens_per_step"]
    yield Row(
        "train",
        f"step time ({label}, {tokens} tokens)",
        ours["step_time_s"],
        "s",
        anchor,
        theirs.get("step_time_s"),
        error or ours["workload"],
    )
    yield Row(
        "train",
        f"MFU ({label})",
        ours["mfu"],
        "",
        anchor,
        theirs.get("mfu"),
        error or "each model's own FLOPs (vidforge.models.flops)",
    )
    yield Row(
        "train",
        f"peak memory ({label})",
        ours["peak_memory_gib"],
        "GiB",
        anchor,
        theirs.get("peak_memory_gib"),
        error or ours["peak_memory_method"],
    )
    if not compiled and theirs:
        counts = (float(theirs["vidforge_parameters"]), float(theirs["parameters"]))
        yield Row("train", "parameters", counts[0], "", "diffusers Wan", counts[1])


def train_eager(ctx: Context, work: Path) -> Iterator[Row]:
    """The training step pair without compile."""
    yield from _train(ctx, compiled=False)


def train_compiled(ctx: Context, work: Path) -> Iterator[Row]:
    """The training step pair with train.compile (each block compiled) beside the peer's compiled blocks.
    Left out of the CPU smoke run (inductor's C++ build takes minutes on a CPU)."""
    if ctx.smoke:
        yield Row("train", "step time (compiled)", None, note="not in the CPU smoke run (inductor C++ build)")
        return
    yield from _train(ctx, compiled=True)


def infer(ctx: Context, work: Path) -> Iterator[Row]:
    """The guided sampling step (one model call on the doubled batch of classifier-free guidance) of
    `vidforge bench infer` with the profile's own sampler (the objective's: unipc under flow), beside
    diffusers' Wan forward on the same doubled batch. One sampler, batched guidance: every sampler
    calls the same model, so more would only repeat the per-call time."""
    from vidforge.profile import load_profile

    s = ctx.shapes
    sets = bench_sets(ctx, s.latent, "none") + _sets(
        {"infer.batch_size": 1, "diffusion.steps": s.infer_steps}
    )
    sampler = load_profile(PROFILE, [a for a in sets if a != "--set"]).diffusion.sampler
    args = ["bench", "infer", "--profile", PROFILE, *sets, "--sampler", sampler, "--guidance", "batched"]
    ours = vidforge(args, ctx)
    theirs = peer("infer", ctx, s.latent)
    for r in ours["rows"]:
        anchor = "diffusers Wan, batch 2" if r["rows_per_call"] == 2 else ""
        yield Row(
            "infer",
            f"{r['sampler']} {r['guidance']}: per model call",
            r["per_model_call_s"],
            "s",
            anchor,
            theirs["step_time_s"] if anchor else None,
            f"{ours['objective']} objective; {r['model_calls']} calls of {r['rows_per_call']} row(s), "
            f"{r['end_to_end_s']:.4g} s end to end",
        )


def memory(ctx: Context, work: Path) -> Iterator[Row]:
    """The memory model's prediction (what `vidforge bench plan` says) beside the measured peak of the
    same training step, at each of the shapes' token counts (the train shape's is the train step's
    eager run, not run again)."""
    points = sorted(ctx.shapes.memory_latents.items(), key=lambda item: item[1] != ctx.shapes.latent)
    for label, latent in points:
        ours = vidforge(train_args(ctx, latent), ctx)
        yield Row(
            "memory",
            f"peak at {label} tokens ({ctx.shapes.recompute} recompute)",
            ours["peak_memory_gib"],
            "GiB",
            "memory model",
            ours["predicted_measured_terms_gib"],
            ours["peak_memory_method"],
        )


def offload(ctx: Context, work: Path) -> list[Row]:
    """Activation offload (half the blocks, none recomputing) beside the same step keeping everything on
    the device, at the smaller memory shape (the larger would need ~90 GiB of pinned host memory): the
    step-time ratio says how much of the copying the side stream hides, the peak what it saves."""
    latent = min(ctx.shapes.memory_latents.values(), key=lambda t: t[0] * t[1] * t[2])
    args = ["bench", "train", "--profile", PROFILE, *bench_sets(ctx, latent, "none")]
    plain = vidforge(args, ctx)
    ours = vidforge([*args, *_sets({"train.activation_offload": 0.5})], ctx)
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
    whole = Row(
        "caption",
        "all annotations: clips/s",
        round(report["clips"] / report["wall_s"], 3) if report["wall_s"] else None,
        "clips/s",
        "NeMo Curator's caption + enhance minimum (one 8-GPU node)",
        CURATOR_CAPTION,
        f"{report['clips']} clips in {report['wall_s']:.1f} s",
    )
    return [whole] + [
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

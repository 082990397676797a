"""`vidforge bench` end to end through the CLI on tiny configs: every subcommand runs, writes what it
promises, and its figures are sane (positive, MFU below 1, more tokens take more FLOPs and memory,
guidance batching and sequential guidance sample the same latents)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vidforge.cli.app import app

runner = CliRunner()
TINY = [
    "model.preset=tiny",
    "model.hidden=64",
    "model.mlp_hidden=256",
    "model.patch=[1,2,2]",
    "model.in_channels=4",
    "model.abs_position=none",
    "bench.latent_frames=2",
    "bench.latent_height=8",
    "bench.latent_width=8",
    "bench.text_tokens=4",
    "bench.warmup=1",
    "bench.repeats=2",
    "train.precision=fp32",
]


def invoke(*args: str, sets: list[str] = TINY) -> dict:
    argv = ["--json", "bench", *args]
    for item in sets:
        argv += ["--set", item]
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    return next(obj for obj in lines if obj["event"] == "result")


def test_bench_train_figures_are_sane_and_grow_with_tokens() -> None:
    short = invoke("train")
    long = invoke(
        "train", sets=[*TINY, "bench.latent_frames=16", "bench.latent_height=16", "bench.repeats=3"]
    )
    for r in (short, long):
        assert r["step_time_s"] > 0 and r["tokens_per_s"] > 0
        assert 0 < r["mfu"] < 1
        assert r["peak_memory_gib"] > 0 and r["predicted_memory_gib"] > 0
        assert r["predicted_measured_terms_gib"] == pytest.approx(r["peak_memory_gib"], rel=0.15)
    # what cannot flake: token and FLOP counts, memory (step times belong in benchmarks, not tests)
    assert long["tokens_per_step"] == 16 * short["tokens_per_step"]
    assert long["flops_per_step"] > 16 * short["flops_per_step"]
    assert long["peak_memory_gib"] > short["peak_memory_gib"]
    assert long["measured_memory"]["activations"] > 8 * short["measured_memory"]["activations"]


def test_bench_train_runs_the_layout_on_its_ranks_only() -> None:
    sets = ["--set", "cluster.cpu_processes=2", "--set", "parallel.pp=2", "--set", "model.layers=2"]
    result = runner.invoke(app, ["bench", "train", *sets])
    assert result.exit_code == 2
    assert "needs 2 rank(s) but 1 started; use --nproc 2" in result.output


def test_bench_infer_every_sampler_with_and_without_guidance_batching() -> None:
    r = invoke("infer", sets=[*TINY, "diffusion.steps=3", "infer.batch_size=2", "bench.repeats=1"])
    rows = {(row["sampler"], row["guidance"]): row for row in r["rows"]}
    assert set(rows) == {(s, g) for s in ("heun", "res") for g in ("batched", "sequential")}
    for row in rows.values():
        assert row["end_to_end_s"] > 0 and row["per_step_s"] == pytest.approx(row["end_to_end_s"] / 3)
    # Heun: 2N - 1 evaluations; RES: N. Batched guidance: one call of 2B rows; sequential: two of B.
    assert rows[("heun", "batched")]["model_calls"] == 5 and rows[("heun", "batched")]["rows_per_call"] == 4
    assert (
        rows[("heun", "sequential")]["model_calls"] == 10
        and rows[("heun", "sequential")]["rows_per_call"] == 2
    )
    assert rows[("res", "batched")]["model_calls"] == 3


def test_bench_infer_times_the_samplers_of_the_flow_objective() -> None:
    flow = [*TINY, "diffusion.objective=flow", "diffusion.steps=3", "infer.batch_size=2", "bench.repeats=1"]
    r = invoke("infer", "--guidance", "batched", sets=flow)
    assert r["objective"] == "flow" and r["samplers"] == ["unipc", "flow-euler"]
    assert [(row["sampler"], row["guidance"]) for row in r["rows"]] == [
        ("unipc", "batched"),
        ("flow-euler", "batched"),
    ]
    # one model call of the doubled batch per step: both are first-order in their calls
    assert all(row["model_calls"] == 3 and row["rows_per_call"] == 4 for row in r["rows"])
    argv = ["bench", "infer", "--sampler", "heun", *[a for s in flow for a in ("--set", s)]]
    refused = runner.invoke(app, argv)
    assert refused.exit_code == 2
    assert "--sampler: heun do not sample the flow objective; use some of unipc, flow-euler" in refused.output


def test_sequential_guidance_samples_what_batched_guidance_samples() -> None:
    import torch

    from vidforge.bench.infer_bench import sequential_guidance
    from vidforge.diffusion import classifier_free_guidance

    torch.manual_seed(0)
    weights = torch.randn(3)

    def batched(x, sigma, uncond):  # a denoiser whose answer depends on the branch, row by row
        return x * weights[0] + sigma * weights[1] + uncond.float()[:, None] * weights[2]

    x, sigma = torch.randn(2, 5, dtype=torch.float64), torch.tensor(0.7, dtype=torch.float64)
    for scale in (1.0, 4.5):
        expected = classifier_free_guidance(batched, scale)(x, sigma)
        torch.testing.assert_close(
            sequential_guidance(batched, scale)(x, sigma), expected, rtol=0, atol=1e-12
        )


def test_bench_attention_times_available_backends_and_skips_the_rest() -> None:
    r = invoke("attention", sets=[*TINY, "bench.attention_seq_lens=[64,256]"])
    rows = {(row["backend"], row["seq_len"]): row for row in r["rows"]}
    for seq in (64, 256):
        for backend in ("sdpa", "dense"):
            row = rows[(backend, seq)]
            assert row["skipped"] is None and row["forward_tflops"] > 0 and row["forward_backward_tflops"] > 0
    assert rows[("flash", 64)]["skipped"]  # no GPU, no flash-attn here
    assert rows[("flex", 64)]["skipped"].startswith("backward")  # FlexAttention has no CPU backward
    # what cannot flake: the FLOPs behind each rate grow with the square of the length (times are benchmarks')
    flops = {
        seq: rows[("sdpa", seq)]["forward_tflops"] * rows[("sdpa", seq)]["forward_s"] for seq in (64, 256)
    }
    assert flops[256] == pytest.approx(16 * flops[64], rel=1e-6)


def test_bench_plan_explains_the_profile_layout() -> None:
    r = invoke("plan", sets=[*TINY, "train.activation_checkpointing=full"])
    names = [t["name"] for t in r["memory"]["terms"]]
    assert names[:4] == ["parameters", "gradients", "optimizer", "ema"]
    assert "activations" in names and "recompute" in names
    assert r["valid"] and r["step_s"] > 0
    text = runner.invoke(
        app, ["bench", "plan", "--rank", "--world-size", "4", "--set", "cluster.gpus_per_node=4"]
    )
    assert text.exit_code == 0, text.output
    assert "Fastest first" in text.output and "by family of layouts" in text.output


def test_bench_curate_reports_every_stage(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from make_sample_videos import make_sample_videos

    make_sample_videos(tmp_path / "videos", count=1)
    sets = [
        "curation.decode_workers=0",
        "curation.transcode_workers=0",
        "curation.embed=false",
        "curation.caption.decode_workers=0",
    ]
    r = invoke("curate", str(tmp_path / "videos"), "--work-dir", str(tmp_path / "work"), sets=sets)
    assert r["videos"] == 1 and r["source_frames"] > 0 and r["clips"] >= 1
    stages = {(row["command"], row["stage"]): row for row in r["rows"]}
    assert ("clip", "decode") in stages and ("caption", "annotate") in stages
    decode = stages[("clip", "decode")]
    assert decode["frames_per_s"] > 0 and decode["video_seconds_per_s"] > 0
    assert (tmp_path / "work" / "clips" / "summary.json").is_file()


def test_bench_sweep_runs_each_point_in_a_fresh_process_and_writes_csv_json_plot(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    r = invoke(
        "sweep", "--grid", "bench.latent_frames=2,4", "--out", str(out), sets=[*TINY, "bench.repeats=1"]
    )
    assert r["points"] == 2 and r["failed"] == 0, r["rows"]
    with open(out / "sweep.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [row["bench.latent_frames"] for row in rows] == ["2", "4"]
    assert all(row["ok"] == "True" and float(row["tokens_per_s"]) > 0 for row in rows)
    assert int(rows[1]["tokens_per_sample"]) == 2 * int(rows[0]["tokens_per_sample"])
    assert json.loads((out / "sweep.json").read_text())["points"] == 2
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_sweep_records_a_failing_point_and_goes_on(tmp_path: Path) -> None:
    from vidforge.bench.sweep import parse_grid, run_point

    assert parse_grid(["parallel.tp=1,2"]) == [("parallel.tp", ["1", "2"])]
    bad = run_point(None, [*TINY, "model.heads=5"], timeout=60)
    assert not bad["ok"] and "model" in bad["error"]

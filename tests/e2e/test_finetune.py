"""`vidforge finetune` end to end on the CPU (issue 36): generated videos with `.txt` captions beside them and
a tiny random Wan2.1 diffusers pipeline folder -> a LoRA that diffusers' `WanPipeline` loads
(`load_lora_weights`) and samples with; the command stopped by SIGTERM in training and rerun, which passes
over the finished stages and resumes training; validation videos on disk, in TensorBoard's event file and
on the review page.

By default the command runs in this process and a thread sends the process its SIGTERM once training has
logged two steps (the signal reaches the train loop as it reaches a real one): the two runs take 35-55 s
on a loaded 2-core machine, so the tests on them are marked slow. With VIDFORGE_TEST_KILL_RESUME=1, a real
`vidforge finetune` process is signalled instead (about 105 s)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from wan_fixtures import save_tiny_wan_pipeline  # noqa: E402

TEXT_LEN = 8  # captions' tokens: the tiny umT5's vocabulary is ten words

from vidforge.cli.app import app  # noqa: E402
from vidforge.data.media import write_video  # noqa: E402
from vidforge.errors import UserInputError  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")
CAPTIONS = ["a red square moving right", "a blue square moving left", "the red circle on the blue"]
PROMPT = "a red square moving left"
STEPS = 4
# The tiny pipeline's sizes, one-process stages, validation of one prompt at steps 2 and 4 (2 sampling steps).
SETS = (
    f"text_encoder.max_length={TEXT_LEN}", "data.buckets=[[32,32]]", "data.frame_buckets=[5]",
    "data.val_fraction=0", "data.token_budget=64", "data.prefetch=0", "train.precision=fp32",
    "train.save_every=1000", "train.log_every=1", "train.warmup_steps=1", "infer.frames=5", "infer.height=32",
    "infer.width=32", "diffusion.steps=2", "curation.decode_workers=0", "curation.transcode_workers=0",
    "curation.caption.decode_workers=0",
)  # fmt: skip


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    return save_tiny_wan_pipeline(tmp_path_factory.mktemp("Wan2.1-T2V-tiny-Diffusers"))


def _videos(folder: Path) -> Path:
    """Three 8-frame 32x32 videos of a square crossing the frame, each with its caption in VIDEO.txt."""
    folder.mkdir(parents=True)
    for i, caption in enumerate(CAPTIONS):
        frames = np.zeros((8, 32, 32, 3), np.uint8)
        for t in range(8):
            frames[t, 8:16, 2 + 2 * t : 10 + 2 * t, i % 3] = 255
        write_video(folder / f"clip{i}.mp4", frames, fps=8)
        (folder / f"clip{i}.txt").write_text(caption + "\n")
    return folder


def _args(videos: Path, base: Path, out: Path, *sets: str) -> list[str]:
    args = ["finetune", str(videos), "--base", str(base), "-o", str(out), "--steps", str(STEPS)]
    args += ["--prompt", PROMPT, "--validate-every", "2"]
    return args + [a for s in (*SETS, *sets) for a in ("--set", s)]


def _logged_two_steps(metrics: Path) -> bool:
    return metrics.is_file() and len(metrics.read_text().splitlines()) >= 2


def _terminated_here(args: list[str], metrics: Path) -> int:
    def watch() -> None:
        deadline = time.time() + 300
        while time.time() < deadline and not _logged_two_steps(metrics):
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()
    return CliRunner().invoke(app, args).exit_code


def _terminated_process(args: list[str], metrics: Path) -> int:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vidforge.cli.app", *args], env=env, stdout=subprocess.DEVNULL
    )
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not _logged_two_steps(metrics):
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=120)


@pytest.fixture(scope="module")
def finetuned(pipeline, tmp_path_factory) -> tuple[Path, int, str]:
    """The command stopped by SIGTERM after training logged two steps, then the same command again: the
    run folder, the first run's exit code and the second run's output."""
    root = tmp_path_factory.mktemp("finetune")
    videos, out = _videos(root / "videos"), root / "run"
    args = _args(videos, pipeline, out)
    metrics = out / "train" / "metrics.jsonl"
    real = os.environ.get("VIDFORGE_TEST_KILL_RESUME") == "1"
    code = (_terminated_process if real else _terminated_here)(args, metrics)
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output[-3000:]
    return out, code, again.output


@pytest.mark.slow
def test_a_stopped_finetune_resumes_where_it_stopped(finetuned) -> None:
    out, code, output = finetuned
    assert code == 143  # terminated, its checkpoint saved
    steps = [json.loads(line)["step"] for line in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))  # resumed, not restarted, and no step twice
    for name in ("clip", "caption", "shard", "tokenize"):  # done before the signal: passed over
        assert f"{name} (done before, passed over): vidforge {name} " in output
    assert "resumed from step" in output
    # each stage's command runs it alone: the printed train command names the run's own profile
    assert f"--profile {out / 'profile.yaml'} --resume" in output
    record = json.loads((out / ".finetune" / "train.json").read_text())
    assert record["result"]["last_step"] == STEPS
    # each video whole, one clip each, re-timed to the wan family's 16 fps (the videos are 8 fps)
    clips = [json.loads(line) for line in (out / "clips" / "manifest.jsonl").read_text().splitlines()]
    assert [(Path(c["source"]).name, c["fps"]) for c in clips] == [(f"clip{i}.mp4", 16) for i in range(3)]


@pytest.mark.slow
def test_the_lora_loads_and_samples_in_diffusers_wan_pipeline(finetuned, pipeline) -> None:
    import torch
    from diffusers import WanPipeline
    from safetensors.torch import load_file

    out, _, _ = finetuned
    lora = out / "train" / "export"
    pipe = WanPipeline.from_pretrained(pipeline)
    pipe.load_lora_weights(lora)
    trained = load_file(lora / "pytorch_lora_weights.safetensors")
    loaded = {k: v for k, v in pipe.transformer.state_dict().items() if "lora_" in k}
    assert len(loaded) == len(trained) > 0  # every adapter tensor of the file, in place
    ups = [v for k, v in trained.items() if "lora_B" in k]
    assert any(v.abs().sum() > 0 for v in ups)  # trained: peft starts lora_B at zero
    frames = pipe(
        PROMPT, height=32, width=32, num_frames=5, num_inference_steps=2, max_sequence_length=TEXT_LEN,
        output_type="np", generator=torch.Generator().manual_seed(0),
    ).frames  # fmt: skip
    assert frames.shape == (1, 5, 32, 32, 3) and np.isfinite(frames).all()


@pytest.mark.slow
def test_validation_videos_are_on_disk_in_tensorboard_and_on_the_review_page(finetuned) -> None:
    from tensorboard.backend.event_processing.event_accumulator import IMAGES, EventAccumulator

    out, _, _ = finetuned
    validation = out / "train" / "validation"
    steps = sorted(int(p.name.removeprefix("step_")) for p in validation.iterdir())
    assert steps == [2, 4]
    for step in steps:
        prompts = json.loads((validation / f"step_{step:08d}" / "prompts.json").read_text())
        assert list(prompts.values()) == [PROMPT]
        assert all((validation / f"step_{step:08d}" / name).stat().st_size > 0 for name in prompts)
    events = EventAccumulator(str(out / "train" / "tensorboard"), size_guidance={IMAGES: 0})
    events.Reload()
    assert sorted({e.step for e in events.Images("validation/0")}) == steps
    page = (out / "train" / "review" / "index.html").read_text()
    for step in steps:
        assert f"step_{step:08d}/" in page and f'"step {step}"' in page


def test_a_recipe_that_does_not_fit_is_refused_before_any_stage(pipeline, tmp_path) -> None:
    videos = _videos(tmp_path / "videos")
    tiny = "cluster.accelerator={name: tiny, kind: cpu, peak_bf16_flops: 1.0e12, memory_gib: 0.0001}"
    result = CliRunner().invoke(app, _args(videos, pipeline, tmp_path / "run", tiny))
    assert result.exit_code == 2
    assert "finetune: needs" in result.output and "GiB per rank" in result.output
    assert not (tmp_path / "run" / "clips").exists()


def test_captions_come_from_sidecars_or_one_table(tmp_path) -> None:
    from vidforge.finetune import gather_captions

    videos = _videos(tmp_path / "videos")
    names = [(p.name, c) for p, c in gather_captions(videos, [".mp4"])]
    assert names == [(f"clip{i}.mp4", c) for i, c in enumerate(CAPTIONS)]
    for p in videos.glob("*.txt"):
        p.unlink()
    with pytest.raises(UserInputError, match=r"clip0.mp4: no caption beside it \(clip0.txt\)"):
        gather_captions(videos, [".mp4"])
    rows = [{"file_name": f"clip{i}.mp4", "text": f"caption {i}"} for i in range(3)]
    (videos / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [c for _, c in gather_captions(videos, [".mp4"])] == ["caption 0", "caption 1", "caption 2"]
    table = tmp_path / "captions.csv"
    table.write_text("video,caption\nvideos/clip0.mp4,only one\n")
    with pytest.raises(UserInputError, match="no caption for 2 video"):
        gather_captions(videos, [".mp4"], table)


@pytest.mark.slow
def test_a_base_without_its_vae_or_a_lora_run_as_base_is_refused(finetuned, pipeline, tmp_path) -> None:
    out, _, _ = finetuned
    videos = _videos(tmp_path / "videos")
    alone = CliRunner().invoke(app, _args(videos, pipeline / "transformer", tmp_path / "a"))
    assert (
        alone.exit_code == 2 and "a transformer folder alone; pass the whole pipeline folder" in alone.output
    )
    lora = CliRunner().invoke(app, _args(videos, out / "train", tmp_path / "b"))
    assert lora.exit_code == 2 and "a LoRA run, not a model" in lora.output
    inside = CliRunner().invoke(app, _args(videos, pipeline, videos / "run"))
    assert inside.exit_code == 2 and "inside the videos' folder" in inside.output


def test_a_refusals_shorter_clip_is_named_in_the_datas_terms() -> None:
    """bench plan's recipes size a clip in latents (bench.latent_*); a fine-tune trains the data's buckets in
    pixels: 13 latent frames of a 4x temporal VAE are (13 - 1) * 4 + 1 = 49 frames."""
    from vidforge.finetune import _clip_as_data_sets
    from vidforge.profile import load_profile

    profile = load_profile(None, ["tokenizer.spatial_compression=8", "data.buckets=[[480,832]]"])
    sets = {"bench.latent_frames": 13, "bench.latent_height": 40, "parallel.dp_shard": 1}
    assert _clip_as_data_sets(profile, sets) == {
        "data.frame_buckets": [49],
        "data.buckets": [[320, 832]],
        "parallel.dp_shard": 1,
    }


@pytest.mark.slow
def test_a_rerun_on_changed_captions_is_refused_naming_what_to_remove(finetuned, pipeline) -> None:
    """The caption stage's own ledger would keep the old captions: refused before anything is written."""
    out, _, _ = finetuned
    sidecar = out.parent / "videos" / "clip1.txt"
    before, written = sidecar.read_text(), (out / "captions.csv").read_text()
    sidecar.write_text("a green square moving up\n")
    try:
        result = CliRunner().invoke(app, _args(out.parent / "videos", pipeline, out))
    finally:
        sidecar.write_text(before)
    assert result.exit_code == 2
    assert f"caption: {out / 'captioned'} was made from other videos, captions or settings" in result.output
    assert f"rm -r {out / 'captioned'} {out / 'shards'} {out / 'latents'}" in result.output
    assert (out / "captions.csv").read_text() == written


@pytest.mark.skipif(
    os.environ.get("VIDFORGE_TEST_ALL_LAYOUTS") != "1",
    reason="opt-in: VIDFORGE_TEST_ALL_LAYOUTS=1 (about 2 min)",
)
@pytest.mark.slow
def test_finetune_trains_on_two_ranks_validating_under_fsdp(pipeline, tmp_path) -> None:
    """--nproc 2 runs the printed train command as two ranks (FSDP2 over the LoRA run, EMA on): validation
    puts the training weights back after sampling the EMA ones (FSDP2 leaves the root's gathered)."""
    videos, out = _videos(tmp_path / "videos"), tmp_path / "run"
    result = CliRunner().invoke(app, [*_args(videos, pipeline, out), "--nproc", "2"])
    assert result.exit_code == 0, result.output[-3000:]
    assert "--resume --nproc 2" in result.output
    steps = sorted(int(p.name.removeprefix("step_")) for p in (out / "train" / "validation").iterdir())
    assert steps == [2, 4]
    losses = [json.loads(line)["loss"] for line in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == STEPS and all(np.isfinite(losses))
    assert json.loads((out / "train" / "export" / "config.json").read_text())["step"] == STEPS


def test_a_linked_videos_caption_is_the_one_beside_the_link_and_a_spreadsheets_csv_reads(tmp_path) -> None:
    from vidforge.finetune import gather_captions

    stored = _videos(tmp_path / "store")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "mine.mp4").symlink_to(stored / "clip0.mp4")
    (linked / "mine.txt").write_text("my own caption")
    assert gather_captions(linked, [".mp4"]) == [(linked / "mine.mp4", "my own caption")]
    (linked / "mine.txt").unlink()
    (linked / "captions.csv").write_bytes("\ufeffpath,caption\nmine.mp4,from excel\n".encode())
    assert gather_captions(linked, [".mp4"]) == [(linked / "mine.mp4", "from excel")]


@pytest.mark.slow
def test_a_removed_and_an_added_video_redo_only_their_clips(finetuned, pipeline) -> None:
    """Issue 44: removing the short videos threw away every clip. The clip stage now reruns on the new set
    and its ledger redoes only the added video; the other clips' files stay as they were. Last in the
    module: it changes the run `finetuned` made (and puts the videos back after)."""
    from vidforge.data.manifest import read_jsonl

    out, _, _ = finetuned
    videos = out.parent / "videos"
    clips = out / "clips" / "clips"
    before = {p.name: p.stat().st_mtime_ns for p in clips.rglob("*") if p.is_file()}
    kept = {r["clip_id"]: r["source"] for r in read_jsonl(out / "clips" / "manifest.jsonl")}
    moved = out.parent / "set_aside"
    moved.mkdir()
    for name in ("clip2.mp4", "clip2.txt"):
        (videos / name).rename(moved / name)
    added = videos / "clip3.mp4"
    frames = np.zeros((8, 32, 32, 3), np.uint8)
    frames[:, 16:24, 8:16, 1] = 255
    write_video(added, frames, fps=8)
    (videos / "clip3.txt").write_text("a green square\n")
    try:
        result = CliRunner().invoke(app, _args(videos, pipeline, out))
    finally:
        added.unlink()
        (videos / "clip3.txt").unlink()
        for name in ("clip2.mp4", "clip2.txt"):
            (moved / name).rename(videos / name)
    assert result.exit_code == 0, result.output[-3000:]
    assert "clip (running)" in result.output
    now = {r["clip_id"]: r["source"] for r in read_jsonl(out / "clips" / "manifest.jsonl")}
    assert sorted(Path(s).name for s in now.values()) == ["clip0.mp4", "clip1.mp4", "clip3.mp4"]
    unchanged = [cid for cid, source in kept.items() if not source.endswith("clip2.mp4")]
    assert len(unchanged) == 2 and set(unchanged) <= set(now)
    files = {p.name: p.stat().st_mtime_ns for p in clips.rglob("*") if p.is_file()}
    old = [name for name in before if any(cid in name for cid in unchanged)]
    assert old and all(files[name] == before[name] for name in old)  # not rewritten
    captioned = read_jsonl(out / "captioned" / "manifest.jsonl")
    assert sorted(r["caption"] for r in captioned) == sorted([CAPTIONS[0], CAPTIONS[1], "a green square"])

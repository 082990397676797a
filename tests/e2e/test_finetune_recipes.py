"""README's fine-tune recipes at the shapes README prints (issue 44): the first recipe, `vidforge finetune
videos/ --base W -o RUN --profile dit1b_1xh200 --set data.buckets=[[480,832]] --set data.frame_buckets=[49]`,
on a generated 480x832 video of 52 frames at 16 fps and a tiny random Wan2.1 folder in the published
diffusers layout (`tests/wan_fixtures.py`, with the thinnest AutoencoderKLWan: the VAE's encoding at that
size is the test's cost), through every stage to its optimizer step (20,280 tokens a sample: before
finetune sized the token budget it skipped every sample forever), 29 s on 2 cores at a load of 2.5; what
finetune sizes and refuses before any stage, against numbers worked out here by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from recipes import (  # noqa: E402
    ON_CPU,
    WAN_HERE,
    assert_trained,
    exported,
    finetune,
    run_profile,
    thinnest_wan21_vae,
    write_videos,
)
from wan_fixtures import save_tiny_wan_pipeline  # noqa: E402

from vidforge.errors import UserInputError  # noqa: E402

RECIPE = (
    "--profile",
    "dit1b_1xh200",
    "--set",
    "data.buckets=[[480,832]]",
    "--set",
    "data.frame_buckets=[49]",
)
# 49 frames through Wan2.1's 4x temporal, 8x spatial VAE and the 1x2x2 patch: 13 x 30 x 52.
TOKENS_480x832x49 = ((49 - 1) // 4 + 1) * (480 // 8 // 2) * (832 // 8 // 2)


@pytest.fixture(scope="module")
def wan(tmp_path_factory) -> Path:
    return save_tiny_wan_pipeline(tmp_path_factory.mktemp("Wan2.1-T2V-tiny-Diffusers"))


def _save_thinnest_vae_pipeline(root: Path) -> Path:
    """The tiny Wan folder with the thinnest VAE (recipes.thinnest_wan21_vae): encoding 49x480x832 is the
    recipe's cost, not the network's."""
    from diffusers import WanPipeline
    from wan_fixtures import text_parts, tiny_transformer

    torch.manual_seed(0)
    vae = thinnest_wan21_vae()
    WanPipeline(transformer=tiny_transformer(), vae=vae, **text_parts()).save_pretrained(root)
    return root


def _videos(folder: Path, frames: tuple[int, ...], height: int = 480, width: int = 832) -> Path:
    return write_videos(folder, frames, height, width, fps=16)


def _finetune(videos: Path, base: Path, out: Path, *args: str, sets: tuple[str, ...] = WAN_HERE):
    return finetune(videos, base, out, *RECIPE, *args, sets=sets, ok=False)


@pytest.mark.slow(minutes=1)
def test_readme_first_recipe_trains_at_480x832x49(tmp_path) -> None:
    out, wan = tmp_path / "run", _save_thinnest_vae_pipeline(tmp_path / "Wan2.1-T2V-tiny-Diffusers")
    result = _finetune(_videos(tmp_path / "videos", (52,)), wan, out, "--steps", "1", "--validate-every", "0")
    assert result.exit_code == 0, result.output[-3000:]
    assert TOKENS_480x832x49 == 20280
    profile = run_profile(out)
    assert profile["data"]["token_budget"] == TOKENS_480x832x49  # sized from the bucket, not the 4096 default
    assert profile["train"]["warmup_steps"] == 0 and profile["train"]["log_every"] == 1
    assert (profile["infer"]["frames"], profile["infer"]["height"], profile["infer"]["width"]) == (
        49,
        480,
        832,
    )
    assert profile["infer"]["fps"] == profile["curation"]["fps"] == 16  # Wan2.1's
    assert_trained(out, 1)
    assert "skipping" not in result.output
    export = exported(out)
    assert export["step"] == 1 and export["lora"]["rank"] == 16


def test_a_token_budget_below_the_bucket_is_refused_before_any_stage(wan, tmp_path) -> None:
    out = tmp_path / "run"
    result = _finetune(
        _videos(tmp_path / "videos", (52,), 64, 64), wan, out, sets=(*WAN_HERE, "data.token_budget=4096")
    )
    assert result.exit_code == 2
    assert f"data.token_budget=4096: the bucket of 49 frames at 480x832 is {TOKENS_480x832x49} tokens" in (
        result.output
    )
    assert not (out / "clips").exists()


def test_a_cuda_profile_on_a_cpu_machine_is_refused_before_any_stage(wan, tmp_path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    out = tmp_path / "run"
    on_cuda = tuple(s for s in WAN_HERE if s != ON_CPU)  # the recipe's own accelerator
    result = _finetune(_videos(tmp_path / "videos", (9,), 64, 64), wan, out, sets=on_cuda)
    assert result.exit_code == 2 and "--set cluster.accelerator=cpu" in result.output
    assert not out.exists()


def test_a_short_run_gets_a_warm_up_below_its_steps(wan) -> None:
    """`--steps 5` once met `train.warmup_steps=10: must be below train.steps=5`, a setting finetune added."""
    from vidforge.finetune import base_profile
    from vidforge.finetune.sizing import sized_settings

    user = [*WAN_HERE, "data.buckets=[[480,832]]", "data.frame_buckets=[49]", "train.steps=5"]
    profile = base_profile(wan, "dit1b_1xh200", ["train.warmup_steps=0", *user])  # finetune's placeholder
    sized = {s.key: s.value for s in sized_settings(profile, user)}
    assert sized["train.warmup_steps"] == 0 and sized["data.token_budget"] == TOKENS_480x832x49
    forty = base_profile(wan, "dit1b_1xh200", ["train.warmup_steps=0", *user, "train.steps=40"])
    sized = {s.key: s.value for s in sized_settings(forty, user)}
    assert sized["train.log_every"] == 2 and sized["train.warmup_steps"] == 4  # 20 points; a tenth
    mine = sized_settings(forty, [*user, "data.token_budget=30000", "infer.fps=30"])
    assert not any(s.key in ("data.token_budget", "infer.fps") for s in mine)


def test_videos_shorter_than_the_frame_bucket_are_left_out_by_source_or_refused(wan, tmp_path) -> None:
    from vidforge.errors import UserInputError
    from vidforge.finetune import base_profile, gather_captions
    from vidforge.finetune.preflight import drop_short

    videos = _videos(tmp_path / "videos", (52, 20), 64, 64)  # 20 frames at 16 fps: short of 49
    profile = base_profile(
        wan, None, ["data.buckets=[[64,64]]", "data.frame_buckets=[49]", "curation.fps=16"]
    )
    pairs, said = gather_captions(videos, [".mp4"]), []
    kept = drop_short(pairs, profile, tmp_path / "run", said.append)
    assert [p.name for p, _ in kept] == ["clip0.mp4"]
    (error,) = [json.loads(line) for line in (tmp_path / "run" / "errors.jsonl").read_text().splitlines()]
    assert error["source"] == str(videos / "clip1.mp4") and "20 frames at 16 fps" in error["reason"]
    assert "left out 1 video(s) shorter than 49 frames" in said[0]
    with pytest.raises(UserInputError, match=r"clip1.mp4: 20 frames .* --set data.frame_buckets=\[49,17\]"):
        drop_short(pairs[1:], profile, tmp_path / "run", said.append)


def test_a_packer_over_data_that_never_fits_refuses_instead_of_looping(tmp_path) -> None:
    from vidforge.data.batching import Packer
    from vidforge.data.loader import ShardLoader
    from vidforge.data.testing import make_latent_shards
    from vidforge.errors import UserInputError

    shards = make_latent_shards(tmp_path / "latents", shards=2, per_shard=3, shapes=((5, 8, 8),))
    loader = ShardLoader([shards], epochs=None)  # repeats forever, as training reads
    packer = Packer(loader, (1, 2, 2), token_budget=40)  # each sample: 5 x 4 x 4 = 80 tokens
    with pytest.raises(
        UserInputError, match=r"data.token_budget=40: no sample of the data fits .* 80 tokens"
    ):
        packer.next_batch()
    assert packer.stats["skipped_too_long"] == loader.epoch_samples == 6


def test_ti2v_recipe_sizes_704x1280_at_24_fps_and_i2v_at_480x832(tmp_path) -> None:
    """README's TI2V-5B (704x1280, 121 frames) and I2V (480x832, 81 frames) shapes as finetune resolves them
    on the tiny published folders: TI2V's VAE compresses 16x (704/16/2 x 1280/16/2 = 22 x 40 per latent
    frame, 31 latent frames), validation at the trained size (the default 48-wide infer size once refused
    at train start) and TI2V's 24 fps, not Wan2.1's 16; I2V's 4x8x8 VAE gives 21 x 30 x 52."""
    from wan22_ti2v_fixtures import save_tiny_ti2v_pipeline
    from wan_i2v_fixtures import save_tiny_wan_i2v_pipeline

    from vidforge.finetune import Request, base_profile, stage_overrides
    from vidforge.finetune.preflight import check_buckets, check_validation
    from vidforge.finetune.sizing import sized_settings

    for save, bucket, frames, tokens, fps in (
        (save_tiny_ti2v_pipeline, (704, 1280), 121, 31 * 22 * 40, 24),
        (save_tiny_wan_i2v_pipeline, (480, 832), 81, 21 * 30 * 52, 16),
    ):
        folder = save(tmp_path / save.__name__)
        user = [f"data.buckets=[[{bucket[0]},{bucket[1]}]]", f"data.frame_buckets=[{frames}]"]
        request = Request(tmp_path, folder, tmp_path / "run", steps=20)
        sets = stage_overrides(request, tmp_path / "run" / "captions.csv")
        profile = base_profile(folder, "dit1b_1xh200", [*sets, *user])
        profile = base_profile(folder, "dit1b_1xh200", [*sets, *sized_settings(profile, user), *user])
        check_buckets(profile)
        check_validation(profile)
        assert profile.data.token_budget == tokens
        assert (profile.infer.frames, profile.infer.height, profile.infer.width) == (frames, *bucket)
        assert profile.infer.fps == profile.curation.fps == fps


def test_removing_the_folders_the_stale_message_names_is_enough(tmp_path) -> None:
    """The message once named clips/ ... latents/ but not RUN/.finetune/, and came back after exactly its
    `rm -r`: a stage record whose folder is gone is not done."""
    from vidforge.finetune import StageKey, _Ledger

    out = tmp_path / "run"
    ledger = _Ledger(out)
    for name in ("clip", "caption", "shard", "tokenize"):
        (
            out / {"clip": "clips", "caption": "captioned", "shard": "shards", "tokenize": "latents"}[name]
        ).mkdir(parents=True)
        ledger.mark(name, "old", f"vidforge {name}", {})
    keys = {
        name: StageKey(k, k)
        for name, k in (("clip", "old"), ("caption", "new"), ("shard", "new"), ("tokenize", "new"))
    }
    with pytest.raises(UserInputError) as refused:
        ledger.refuse_stale(keys, out, out / "train")
    removed = str(refused.value).split("rm -r ", 1)[1].split(" (and", 1)[0].split()
    assert removed == [str(out / f) for f in ("captioned", "shards", "latents")]
    for folder in removed:
        Path(folder).rmdir()
    ledger.refuse_stale(keys, out, out / "train")  # no second refusal
    assert ledger.record("clip") is not None and ledger.record("caption") is None


def test_a_broken_video_is_named_by_its_source_in_clips_errors_and_the_refusal(wan, tmp_path) -> None:
    """Issue 44: errors named clip keys rather than the source videos. A file that is no video fails in
    `clip`: its errors.jsonl record and finetune's one line name that file."""
    videos = _videos(tmp_path / "videos", (17,), 64, 64)
    broken = videos / "broken.mp4"
    broken.write_bytes(b"not a video at all")
    (videos / "broken.txt").write_text("a broken file")
    out = tmp_path / "run"
    sets = (*WAN_HERE, "data.buckets=[[64,64]]", "data.frame_buckets=[17]")
    result = finetune(videos, wan, out, "--profile", "dit1b_1xh200", sets=sets, ok=False)
    assert result.exit_code == 2, result.output[-3000:]
    (error,) = [json.loads(line) for line in (out / "clips" / "errors.jsonl").read_text().splitlines()]
    assert error["source"] == str(broken)
    assert f"clip: 1 error(s) (see {out / 'clips' / 'errors.jsonl'}), e.g. {broken}: " in result.output
    assert not (out / "captioned").exists()

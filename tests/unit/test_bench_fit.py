"""`vidforge bench plan --fit` and what the planner says to a plan that does not fit
(`vidforge.bench.fit`), on the 1.3B Wan (its meta-device counts are quick): the recipes it lists fit
when evaluated again from their own --set lines, fastest first; a plan that does not fit exits 2 naming
a change that does; `--rank` has a global-batch column and no two rows that predict the same."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from vidforge.bench.fit import fit, variant
from vidforge.bench.plan import evaluate, format_ranking, rank_layouts
from vidforge.cli.app import app
from vidforge.profile import load_profile

WAN13 = [
    "model.preset=wan2.1-1.3b",
    "model.abs_position=none",
    "diffusion.objective=flow",
    "bench.latent_frames=21",
    "bench.latent_height=60",
    "bench.latent_width=104",
    "bench.text_tokens=512",
    "cluster.nodes=1",
    "cluster.gpus_per_node=1",
    "cluster.accelerator=rtx4090",
    "train.lora={rank: 16}",
]


def test_fit_lists_recipes_that_fit_fastest_first() -> None:
    profile = load_profile("dit1b_1xh200", WAN13)
    assert not evaluate(profile).valid  # no recompute: 81 frames of 480x832 do not fit 24 GB
    report = fit(profile)
    assert report.recipes and report.clip == "81x480x832"
    steps = [r.step_s for r in report.recipes]
    assert steps == sorted(steps)
    for recipe in report.recipes:
        again = evaluate(variant(profile, recipe.sets))  # from the printed --set lines alone
        assert again.valid and again.memory.total <= again.capacity_bytes
        assert again.memory.total == recipe.plan.memory.total
    # one GPU: the recipes are LoRA's memory knobs on the one process
    assert all(r.sets["parallel.dp_shard"] == 1 and r.sets["parallel.cp"] == 1 for r in report.recipes)


def test_fit_falls_back_to_a_smaller_clip_when_none_fits() -> None:
    # A full fine-tune of the 1.3B holds 20 B a parameter (fp32 weights, gradients, AdamW, EMA): 26 GiB,
    # more than a 24 GB card has at any clip; a 32 GB card fits it at 81 frames of 320x576 only.
    full = [item for item in WAN13 if not item.startswith("train.lora")]
    assert not fit(load_profile("dit1b_1xh200", full)).recipes
    profile = load_profile("dit1b_1xh200", [*full, "cluster.accelerator=rtx5090"])
    report = fit(profile)
    assert report.clip == "81x320x576" and report.notes
    first = report.recipes[0]
    assert (first.sets["bench.latent_height"], first.sets["bench.latent_width"]) == (40, 72)
    assert evaluate(variant(profile, first.sets)).valid


def test_an_invalid_plan_exits_2_naming_a_change_that_fits() -> None:
    argv = ["bench", "plan", "--profile", "dit1b_1xh200"]
    for item in WAN13:
        argv += ["--set", item]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "the smallest change that fits: --set" in result.output
    fix = result.output.split("the smallest change that fits: ")[1].split(" (")[0].split()
    sets = [fix[i + 1] for i in range(0, len(fix), 2)]
    profile = load_profile("dit1b_1xh200", [*WAN13, *sets])
    assert evaluate(profile).valid


def test_fit_from_the_cli_prints_the_command_to_paste() -> None:
    argv = ["--json", "bench", "plan", "--profile", "dit1b_1xh200", "--fit", "--model", "wan2.1-1.3b"]
    argv += ["--clip", "81x480x832", "--gpus", "2", "--accelerator", "rtx4090"]
    argv += ["--set", "train.lora={rank: 16}", "--set", "bench.text_tokens=512"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output.strip().splitlines()[-1])
    assert data["recipes"] and data["recipes"][0]["memory_gib"] <= data["recipes"][0]["capacity_gib"]


def test_model_plans_the_preset_itself_under_any_profile() -> None:
    # --help's own example, without --profile: the default profile's tiny model section (hidden 192,
    # patch 1x1x1) must not override the preset's fields, nor its pixel tokenizer the clip's size.
    from vidforge.cli.bench import _machine_sets

    argv = ["--json", "bench", "plan", "--fit", "--model", "wan2.1-14b", "--clip", "81x480x832"]
    argv += ["--gpus", "1", "--accelerator", "rtx4090", "--set", "train.lora={rank: 16}"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output.strip().splitlines()[-1])
    assert data["recipes"] and data["clip"] == "81x480x832"
    sets = _machine_sets("wan2.1-14b", 1, "rtx4090")
    assert load_profile(None, sets).model == load_profile("dit1b_1xh200", sets).model


def test_rank_has_a_batch_column_no_duplicate_rows_and_rejections_in_words() -> None:
    profile = load_profile("dit1b_1xh200", [*WAN13, "cluster.accelerator=h100"])
    report = rank_layouts(profile, 8)
    text = format_ranking(report)
    rows = [line for line in text.splitlines() if line[:3].strip().isdigit()]
    assert "batch" in text.splitlines()[1]
    assert len({row[5:] for row in rows}) == len(rows)
    rejected = text.split("rejected:")[1]
    assert "LoRA has no tensor-parallel plan" in rejected


def test_wan14b_lora_at_81x480x832_fits_one_24gb_card() -> None:
    """Issue #34's case: the 40 blocks' checkpointed inputs (12.5 GiB at 32,760 tokens) do not fit a 24 GB
    card beside one recomputing block whatever the base costs; with those inputs in host memory
    (train.checkpoint_offload), the fp8 base and 8 of its blocks swapped it does."""
    sets = [item.replace("wan2.1-1.3b", "wan2.1-14b") for item in WAN13]
    recipe = {
        "train.activation_checkpointing": "full",
        "train.lora.fp8_base": "true",
        "train.lora.blocks_to_swap": "8",
    }
    profile = load_profile("dit1b_1xh200", sets)
    every_block_swapped = evaluate(variant(profile, {**recipe, "train.lora.blocks_to_swap": "40"}))
    assert not every_block_swapped.valid
    plan = evaluate(variant(profile, {**recipe, "train.checkpoint_offload": "true"}))
    assert plan.valid and plan.memory.total <= plan.capacity_bytes
    assert plan.memory.offloaded_inputs == 40


def test_wan14b_lora_with_a_bf16_base_fits_two_24gb_cards_with_block_swap_under_fsdp2() -> None:
    """Two cards sharding the bf16 base with FSDP2 (13 GiB of it a card) do not fit 81 frames of 480x832
    beside the recompute; 10 blocks' shards in host memory (block swap under FSDP2) do, as `--fit --gpus 2`
    lists them."""
    sets = [item.replace("wan2.1-1.3b", "wan2.1-14b") for item in WAN13] + ["cluster.gpus_per_node=2"]
    recipe = {
        "parallel.dp_shard": "2",
        "train.activation_checkpointing": "full",
        "train.checkpoint_offload": "true",
        "train.lora.blocks_to_swap": "10",
    }
    profile = load_profile("dit1b_1xh200", sets)
    assert not evaluate(variant(profile, {**recipe, "train.lora.blocks_to_swap": "0"})).valid
    plan = evaluate(variant(profile, recipe))
    assert plan.valid and plan.memory.total <= plan.capacity_bytes
    # the swapped shards wait on the host: half of 10 bf16 blocks, and their adapters' AdamW states
    block = 351_394_304 * 2  # bytes of one Wan2.1-14B block in bf16
    assert plan.memory.host_bytes > 10 * block / 2


def test_every_fallback_clip_is_one_each_familys_models_take() -> None:
    """The smaller clips --fit falls back to, for every preset of every registered family (as --model names
    it, at a clip larger than them all): frames (k x temporal) + 1, sides multiples of the spatial
    compression times the patch, under the VAE the family's pipeline pairs with the model."""
    from vidforge.bench.fit import FALLBACK_SIZES, candidate_clips
    from vidforge.cli.bench import _machine_sets
    from vidforge.families import family, names

    big = [
        "bench.latent_frames=31",
        "bench.latent_height=96",
        "bench.latent_width=160",
    ]  # 121 x 768 x 1280 at 8x
    checked = set()
    for name in names():
        spec = family(name)
        for preset in spec.presets:
            profile = load_profile("dit1b_1xh200", [*_machine_sets(preset, 1, "h100"), *big])
            ct, cs = profile.tokenizer.temporal_compression, profile.tokenizer.spatial_compression
            vt, vs = spec.vae_compression(profile.model) if spec.vae_compression else (ct, cs)
            _, ph, pw = profile.model.patch
            fallbacks = candidate_clips(profile)[1:]
            assert len(fallbacks) >= len(FALLBACK_SIZES), preset
            for frames, h, w in fallbacks:
                assert (frames - 1) % vt == 0 and (frames - 1) % ct == 0, (preset, frames)
                assert h % (vs * ph) == 0 and w % (vs * pw) == 0 and h % cs == 0, (preset, h, w)
            checked.add(name)
    assert checked == set(names())

"""Wan2.2 T2V-A14B's two experts (a tiny random two-expert download, `wan22_fixtures`): the folder's
profile, `vidforge infer`'s sampler against diffusers' WanPipeline (same noise, same scheduler: the expert
and its guidance switched at the boundary), and a run's training times on its expert's side of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from wan22_fixtures import BOUNDARY, save_tiny_wan22_pipeline

from vidforge.errors import UserInputError
from vidforge.families import read_published
from vidforge.weights.weights_folder import published_profile

pytest.importorskip("transformers")

STEPS = ["diffusion.steps=4"]  # shift 3: timesteps 999, 900 (high) | 750, 500 (low)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    return save_tiny_wan22_pipeline(tmp_path_factory.mktemp("Wan2.2-T2V-A14B-tiny-Diffusers"))


def test_the_folder_reads_as_two_experts_with_a_guidance_scale_each(pipeline) -> None:
    profile = published_profile(read_published(pipeline), STEPS)
    assert (profile.model.experts, profile.model.boundary_ratio) == (2, BOUNDARY)
    assert (profile.diffusion.guidance, profile.diffusion.guidance_2) == (4.0, 3.0)
    with pytest.raises(
        UserInputError, match=r"^model.boundary_ratio: .* weights have 0.875, the profile says 0.9"
    ):
        published_profile(read_published(pipeline), ["model.boundary_ratio=0.9"])


def test_expert_settings_that_mean_nothing_are_refused_in_one_line() -> None:
    from vidforge.profile.loading import ProfileError, validate_profile

    for data, says in (
        ({"model": {"preset": "wan2.1-14b"}, "diffusion": {"guidance_2": 3.0}}, "diffusion.guidance_2: only"),
        ({"model": {"preset": "wan2.1-14b"}, "train": {"expert": "low"}}, "train.expert: low names"),
        ({"model": {"preset": "wan2.1-14b", "experts": 2}}, "model.boundary_ratio: a two-expert model"),
        (
            {"model": {"preset": "wan2.2-t2v-a14b"}, "train": {"expert": "low", "validate_every": 5}},
            "train.validate_every: the low-noise expert alone",
        ),
        (
            {
                "model": {"preset": "wan2.2-t2v-a14b"},
                "train": {"expert": "high"},
                "diffusion": {"objective": "edm"},
            },
            "diffusion.objective: the high-noise expert trains on its side of model.boundary_ratio",
        ),
        (
            {"model": {"preset": "wan2.1-14b"}, "stages": [{"name": "a", "steps": 1, "expert": "low"}]},
            "stages: in stage 'a', train.expert: low names",
        ),
    ):
        with pytest.raises(ProfileError, match=f"^profile: {says}") as err:
            validate_profile(data)
        assert "\n" not in str(err.value)


def test_infer_refuses_what_two_experts_do_not_sample_with_yet() -> None:
    """The layout rulebook's sampling rules, which `vidforge infer` asks before anything loads."""
    from vidforge.profile.layout_rules import SamplingRun, sampling_run_problems
    from vidforge.profile.loading import validate_profile

    profile = validate_profile({"model": {"preset": "wan2.2-t2v-a14b"}, "diffusion": {"objective": "flow"}})
    assert sampling_run_problems(profile, SamplingRun(1)) == []
    (nproc,) = sampling_run_problems(profile, SamplingRun(2))
    assert nproc.startswith("--nproc 2: a two-expert model")
    cache = profile.infer.cache.model_copy(update={"threshold": 0.1})
    cached = profile.model_copy(update={"infer": profile.infer.model_copy(update={"cache": cache})})
    (caching,) = sampling_run_problems(cached, SamplingRun(1))
    assert caching.startswith("infer.cache.threshold: step caching is fitted to one network's outputs")


def test_infer_samples_the_latents_of_diffusers_wan_pipeline(pipeline) -> None:
    """Float64 networks on both sides; the schedulers' own arithmetic on float32 latents."""
    from diffusers import WanPipeline

    from vidforge.families.wan.expert_weights import load_wan_experts
    from vidforge.sampling.experts import sample_latents_experts
    from vidforge.sampling.latents import initial_noise
    from vidforge.weights.experts import Experts

    profile = published_profile(read_published(pipeline), STEPS)
    model = load_wan_experts(pipeline, dtype=torch.float64).eval()
    assert isinstance(model, Experts)
    g = torch.Generator().manual_seed(0)
    text, negative = torch.randn(1, 6, 16, generator=g), torch.randn(1, 6, 16, generator=g)
    mask = torch.ones(1, 6, dtype=torch.bool)
    shape, seeds = (4, 2, 4, 6), [7]
    ours = sample_latents_experts(model, profile, text, mask, seeds, shape, (negative, mask))

    pipe = WanPipeline.from_pretrained(pipeline)
    pipe.transformer.double(), pipe.transformer_2.double()
    theirs = pipe(
        prompt_embeds=text.double(), negative_prompt_embeds=negative.double(), latents=initial_noise(seeds, shape),
        height=32, width=48, num_frames=5, num_inference_steps=4, guidance_scale=4.0, guidance_scale_2=3.0,
        output_type="latent", return_dict=False,
    )[0]  # fmt: skip
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-5, atol=1e-5)
    # the switch matters: the high-noise expert alone samples other latents
    alone = Experts(model.high, model.high, BOUNDARY)
    other = sample_latents_experts(alone, profile, text, mask, seeds, shape, (negative, mask))
    assert (other - ours).abs().max() > 1e-2


def test_default_infer_equals_the_pipeline_as_the_model_card_calls_it(
    pipeline, tmp_path, monkeypatch
) -> None:
    """`vidforge infer -c` with no sampling argument (`default_parity`) against WanPipeline with its
    defaults (the empty negative caption, the folder's scheduler and shift) and Wan2.2-T2V-A14B's model
    card's guidance_scale=4.0, guidance_scale_2=3.0 (the pipeline's own default, 5.0 for both, is not what
    the model was published to sample with); 16 fps."""
    from default_parity import PROMPT, noise, vidforge_infer
    from diffusers import WanPipeline

    sets = ["infer.height=32", "infer.width=48", "infer.frames=5", *STEPS]
    ours, fps, record = vidforge_infer(pipeline, tmp_path / "out", sets, monkeypatch)
    assert (fps, record["negative_prompt"], record["guidance"], record["guidance_2"]) == (16, "", 4.0, 3.0)
    theirs = WanPipeline.from_pretrained(pipeline)(
        prompt=PROMPT, height=32, width=48, num_frames=5, num_inference_steps=4, guidance_scale=4.0,
        guidance_scale_2=3.0, latents=noise(ours.shape[1:]), output_type="latent",
    ).frames  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=2e-5, atol=2e-5)  # float32 both: 1.1e-5 apart


@pytest.mark.parametrize("sampling", ["logit-normal", "uniform"])
@pytest.mark.parametrize("expert", ["high", "low"])
def test_a_runs_training_times_are_its_experts_side_of_the_boundary(expert, sampling) -> None:
    """Every drawn t on the expert's side (t >= 0.875 runs the high-noise expert), distributed as the
    profile's whole distribution is on that side (its draws kept where they fall there)."""
    from vidforge.diffusion import build_objective
    from vidforge.profile.loading import validate_profile
    from vidforge.train.experts import expert_objective

    sets = {"objective": "flow", "flow_shift": 5.0, "flow_time_sampling": sampling}
    profile = validate_profile(
        {"model": {"preset": "wan2.2-t2v-a14b"}, "diffusion": sets, "train": {"expert": expert}}
    )
    t = expert_objective(build_objective(profile.diffusion), profile).sample_levels(50_000)
    side = t >= BOUNDARY if expert == "high" else t < BOUNDARY
    assert side.all()
    whole = build_objective(profile.diffusion).sample_levels(400_000)
    kept = whole[whole >= BOUNDARY] if expert == "high" else whole[whole < BOUNDARY]
    q = torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95])
    torch.testing.assert_close(torch.quantile(t, q), torch.quantile(kept[:50_000], q), rtol=0, atol=0.01)


def test_the_preset_is_each_published_experts_shape() -> None:
    """Wan2.2-T2V-A14B-Diffusers' transformer/config.json (transformer_2/'s is the same), as vidforge reads
    a download's, and the parameter names and shapes of diffusers' module built from it."""
    from diffusers import WanTransformer3DModel

    from vidforge.families.wan import model_fields
    from vidforge.models import build_model, model_config

    published = {
        "_class_name": "WanTransformer3DModel", "added_kv_proj_dim": None, "attention_head_dim": 128,
        "cross_attn_norm": True, "eps": 1e-06, "ffn_dim": 13824, "freq_dim": 256, "image_dim": None,
        "in_channels": 16, "num_attention_heads": 40, "num_layers": 40, "out_channels": 16,
        "patch_size": [1, 2, 2], "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024, "text_dim": 4096,
    }  # fmt: skip
    preset = model_config("wan2.2-t2v-a14b")
    read = model_fields(published, Path("config.json"))
    assert {k: getattr(preset, k) for k in read if k != "preset"} == {
        **{k: v for k, v in read.items() if k != "preset"},
        "patch": (1, 2, 2),
    }
    assert (preset.experts, preset.boundary_ratio) == (2, BOUNDARY)
    config = {k: v for k, v in published.items() if not k.startswith("_")}
    with torch.device("meta"):
        ref = WanTransformer3DModel(**config)
    ours = build_model(preset, device="meta")
    assert {n: p.shape for n, p in ours.state_dict().items()} == {
        n: p.shape for n, p in ref.state_dict().items()
    }


def test_init_of_an_expert_loads_its_own_folder(pipeline, tmp_path) -> None:
    """From the download (transformer/, transformer_2/) and from its import (the export, low_noise/)."""
    from vidforge.families.wan.weights import load_diffusers_wan
    from vidforge.models import build_model
    from vidforge.train.init_weights import init_from
    from vidforge.weights.weights_folder import import_published

    published = read_published(pipeline)
    profile = published_profile(published, STEPS)
    imported = import_published(published, tmp_path / "imported", profile)  # `model import`
    for expert, folder in (("high", "transformer"), ("low", "transformer_2")):
        own = load_diffusers_wan(pipeline / folder).state_dict()
        for src in (pipeline, imported):
            model = build_model(profile.model)
            assert init_from(model, src, expert=expert).complete
            assert all(torch.equal(t, own[n]) for n, t in model.state_dict().items())


def test_bench_plans_one_expert_of_a_two_expert_preset() -> None:
    from vidforge.cli.bench import _machine_sets
    from vidforge.profile import Override

    assert Override("train.expert", "high") in _machine_sets("wan2.2-t2v-a14b", None, None)
    assert not any(s.key == "train.expert" for s in _machine_sets("wan2.1-14b", None, None))


def test_the_planner_counts_the_one_expert_a_run_trains() -> None:
    """A run of one A14B expert costs what a Wan2.1-14B run costs (one network resident, one running):
    the plan's memory terms and step FLOPs are equal."""
    from vidforge.bench.plan import evaluate
    from vidforge.profile.loading import validate_profile

    plans = []
    for preset, train in (("wan2.1-14b", {}), ("wan2.2-t2v-a14b", {"expert": "high"})):
        model = {"preset": preset, "layers": 2}  # two blocks of the published width: planned as fast
        data = {"model": model, "diffusion": {"objective": "flow"}, "train": train}
        data["bench"] = {"latent_frames": 5, "latent_height": 16, "latent_width": 16}
        plans.append(evaluate(validate_profile(data)))
    one, expert = plans
    assert expert.memory.total == one.memory.total > 0
    assert expert.compute_s == one.compute_s

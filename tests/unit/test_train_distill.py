"""Few-step distillation (DMD2, `train.distill`): the gradient against the KL formula, the two time-scale
rule, exact resume, and `vidforge infer` sampling the student in its own steps."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.diffusion.dmd import FEW_STEP_NOISE, dmd_gradient, dmd_loss, few_step_sampler
from vidforge.diffusion.edm import EDM
from vidforge.diffusion.flow import RectifiedFlow
from vidforge.errors import UserInputError
from vidforge.infer import run as infer_run
from vidforge.models import build_model
from vidforge.profile.loading import dump_profile
from vidforge.tokens import SequenceLayout
from vidforge.train.loss import TokenBatch
from vidforge.train.make_step import make_train_step
from vidforge.weights.checkpoint import save_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import TRAIN_SETS, losses, synthetic_latents, train_profile  # noqa: E402

# A one-block DiT: the mechanics, not the quality, are under test; EMA off so the export is the student.
SMALL = ("model.layers=1", "train.ema_decay=0", "train.schedule=constant")
DISTILL = ("train.distill.steps=2", "train.distill.fake_updates=2", "train.distill.guidance=3")


def test_the_dmd_gradient_is_the_kl_gradient_of_the_two_scores() -> None:
    """With x_t = alpha x + sigma n and each score s(x_t) = -(x_t - alpha x0_hat) / sigma^2, the KL's
    gradient in a sample is -(s_real - s_fake); DMD's is that times sigma^2 / alpha, weighted by
    1 / mean|x - real_x0| per sample. The surrogate loss must hand autograd exactly that, over numel."""
    g = torch.Generator().manual_seed(0)
    x, real, fake, noise = (torch.randn(3, 5, 4, generator=g, dtype=torch.float64) for _ in range(4))
    alpha, sigma = 0.6, 0.8
    x_t = alpha * x + sigma * noise
    s_real = -(x_t - alpha * real) / sigma**2
    s_fake = -(x_t - alpha * fake) / sigma**2
    expected = torch.empty_like(x)
    for i in range(x.shape[0]):  # the slow way: one sample at a time, its weight by a Python sum
        values = [abs(float(a - b)) for a, b in zip(x[i].flatten(), real[i].flatten(), strict=True)]
        weight = len(values) / sum(values)
        expected[i] = -(s_real[i] - s_fake[i]) * sigma**2 / alpha * weight
    x = x.requires_grad_()
    gradient = dmd_gradient(x, real, fake)
    torch.testing.assert_close(gradient, expected)
    (grad_x,) = torch.autograd.grad(dmd_loss(x, gradient), x)
    torch.testing.assert_close(grad_x * x.numel(), expected)


@pytest.mark.parametrize("objective", [EDM(), RectifiedFlow()], ids=["edm", "flow"])
def test_dmd_moves_a_generator_onto_the_teachers_gaussian(objective) -> None:
    """Distribution matching on a closed form: data N(1.5, 0.5^2), a generator x = a + b z from N(0, 1),
    both scores exact (the posterior mean of a Gaussian under x_t = alpha x + s n, the fake one for the
    generator's current a, b). DMD's gradient alone carries (a, b) to the data's mean and spread."""
    torch.manual_seed(0)
    mean, sd = 1.5, 0.5
    a, b = torch.zeros((), requires_grad=True), torch.ones((), requires_grad=True)
    optimizer = torch.optim.Adam([a, b], lr=0.02)

    def posterior_mean(mu, var, x_t, level):
        alpha, s = (1.0, level) if isinstance(objective, EDM) else (1 - level, level)
        return mu + alpha * var / (alpha**2 * var + s**2) * (x_t - alpha * mu)

    for _ in range(250):
        x = a + b * torch.randn(64, 8, 1)
        level = objective.sample_levels(64)[:, None, None]
        with torch.no_grad():
            x_t = objective.corrupt(x, torch.randn_like(x), level)
            real = posterior_mean(mean, sd**2, x_t, level)
            fake = posterior_mean(a.detach(), b.detach() ** 2, x_t, level)
        optimizer.zero_grad()
        dmd_loss(x, dmd_gradient(x, real, fake)).backward()
        optimizer.step()
    assert float(a.detach()) == pytest.approx(mean, abs=0.02)
    assert abs(float(b.detach())) == pytest.approx(sd, abs=0.02)


def test_a_packed_rows_sample_weights_are_each_samples_own_mean() -> None:
    layout = SequenceLayout(((1, 2, 2), (1, 1, 3)))  # 4 + 3 tokens
    x = torch.arange(7 * 2, dtype=torch.float32).reshape(1, 7, 2)
    rows = TokenBatch(x, torch.zeros(2, 1, 1), torch.ones(2, 1, dtype=torch.bool), layout, 7)
    means = rows.sample_mean(x)
    torch.testing.assert_close(means[0, :4, 0], x[0, :4].mean().expand(4))
    torch.testing.assert_close(means[0, 4:, 0], x[0, 4:].mean().expand(3))


@pytest.mark.parametrize("objective", [EDM(), RectifiedFlow()], ids=["edm", "flow"])
@pytest.mark.parametrize("renoise", FEW_STEP_NOISE)
def test_the_few_step_sampler_returns_what_an_exact_denoiser_of_one_point_gives(objective, renoise) -> None:
    """All mass at one point c: every clean estimate is c, so the sample is c after any number of steps,
    and the sampler calls the denoiser once per level, at those levels."""
    c = torch.full((2, 3), 0.25)
    seen: list[float] = []

    def denoise(x: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
        seen.append(float(level))
        return c.expand_as(x)

    levels = (1.0, 0.6, 0.3) if isinstance(objective, RectifiedFlow) else (80.0, 2.0, 0.5)
    out = few_step_sampler(denoise, torch.randn(2, 3), levels, objective, torch.randn_like, renoise)
    torch.testing.assert_close(out, c)
    assert seen == pytest.approx(levels)


@pytest.mark.parametrize("objective", [EDM(), RectifiedFlow()], ids=["edm", "flow"])
@pytest.mark.parametrize("renoise", FEW_STEP_NOISE)
def test_the_few_step_samplers_output_is_the_clean_estimate_of_its_last_call(objective, renoise) -> None:
    """The sample is what the denoiser returned at the last level, not a noisy input there."""
    returned: list[torch.Tensor] = []

    def denoise(x: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
        returned.append(torch.tanh(x) * 0.5 + 0.1 * float(level))
        return returned[-1]

    levels = (1.0, 0.75, 0.5, 0.25) if isinstance(objective, RectifiedFlow) else (80.0, 10.0, 2.0, 0.5)
    out = few_step_sampler(denoise, torch.randn(2, 3), levels, objective, torch.randn_like, renoise)
    assert len(returned) == 4 and torch.equal(out, returned[-1])


def test_implied_renoising_makes_the_few_step_sampler_flow_euler_over_its_levels_and_0() -> None:
    """Noising each clean estimate with the noise its input implies is a DDIM step, which on the flow
    path is an Euler step of dx/dt = (x - D) / t; the last Euler step, to t = 0, lands on D itself."""
    from vidforge.diffusion.flow_samplers import flow_euler_sampler

    def denoise(x: torch.Tensor, level: torch.Tensor) -> torch.Tensor:  # nonlinear in x and t
        return torch.tanh(1.5 * x) * (1 - 0.5 * level) + 0.2

    noise = torch.randn(3, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    levels = (1.0, 0.75, 0.5, 0.25)
    out = few_step_sampler(denoise, noise, levels, RectifiedFlow(), torch.randn_like, "implied")
    euler = flow_euler_sampler(denoise, noise, torch.tensor([*levels, 0.0], dtype=torch.float64))
    torch.testing.assert_close(out, euler)


@pytest.mark.parametrize("objective", ["edm", "flow"])
def test_the_students_default_levels_start_from_pure_noise_and_stop_short_of_clean(objective) -> None:
    from vidforge.diffusion.from_profile import student_levels

    diffusion = train_profile(f"diffusion.objective={objective}", "diffusion.flow_shift=3").diffusion
    for steps in (1, 2, 4):
        levels = student_levels(diffusion, steps)
        start = diffusion.sigma_max if objective == "edm" else 1.0
        assert len(levels) == steps and levels[0] == pytest.approx(start)
        assert all(a > b for a, b in zip(levels, levels[1:], strict=False))
        assert levels[-1] > (10 * diffusion.sigma_min if objective == "edm" else 0.1)


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_the_students_default_flow_levels_for_4_steps_are_wans_grid_shifted(shift) -> None:
    """Closed form: t_k = 1 - k (1 - 1/1000) / 4 for k = 0..3, then t -> s t / (1 + (s - 1) t)."""
    from vidforge.diffusion.from_profile import student_levels

    diffusion = train_profile("diffusion.objective=flow", f"diffusion.flow_shift={shift}").diffusion
    ramp = [1 - k * 0.999 / 4 for k in range(4)]  # 1, 0.75025, 0.5005, 0.25075
    expected = [shift * t / (1 + (shift - 1) * t) for t in ramp]
    assert student_levels(diffusion, 4) == pytest.approx(expected, abs=1e-12)


def test_the_students_default_levels_are_the_teachers_sampling_times_under_a_token_count_shift() -> None:
    """diffusion.flow_shift_tokens (LTX-2's shift by the sample's token count): the student's levels are
    the times the teacher's sampler calls the network at, sampling infer's size in the student's steps."""
    from vidforge.sampling.latents import sample_latents
    from vidforge.sampling.shape import check_shape
    from vidforge.tokenizers.base import build_tokenizer
    from vidforge.train.distill import student_profile

    sets = (*SMALL, "diffusion.objective=flow", "diffusion.sampler=flow-euler", "diffusion.flow_schedule_end=0",
            "diffusion.flow_shift_tokens=[16,0.5,256,2.0]", "diffusion.flow_shift_terminal=0.1",
            "infer.frames=9", "infer.height=64", "infer.width=96")  # fmt: skip  # LTX-2's schedule
    teacher = train_profile(*sets, "diffusion.steps=3", "diffusion.guidance=1")
    model = build_model(teacher.model).eval()
    seen: list[float] = []

    def recording(x, noise_level, *args, **kwargs):
        seen.append(float(noise_level.flatten()[0]))
        return model(x, noise_level, *args, **kwargs)

    shape = check_shape(teacher, build_tokenizer(teacher))
    text, mask = torch.zeros(1, 4, teacher.model.text_dim), torch.ones(1, 4, dtype=torch.bool)
    with torch.no_grad():
        sample_latents(model, teacher, text, mask, [0], shape, forward=recording)
    student = student_profile(train_profile(*sets, "train.distill.steps=3")).diffusion
    assert len(seen) == 3 and seen[0] == 1.0
    assert student.few_step_levels == pytest.approx(seen, rel=1e-6)
    assert student_profile(train_profile(*sets[:-3], "train.distill.steps=3")).diffusion.few_step_levels != (
        pytest.approx(seen, rel=1e-6)
    )  # another infer size, another shift


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """A teacher export: the small DiT at random weights (the mechanics need no trained one), perturbed
    off its zero-initialised output layers so that its output depends on its input and caption."""
    folder = tmp_path_factory.mktemp("teacher") / "export"
    profile = train_profile(*SMALL)
    torch.manual_seed(0)
    model = build_model(profile.model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    save_model(model, folder)
    (folder / "profile.yaml").write_text(dump_profile(profile))
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return synthetic_latents(tmp_path_factory.mktemp("distill_data"))


def distill_sets(teacher: Path, *extra: str) -> tuple[str, ...]:
    return (*SMALL, *DISTILL, f"train.distill.teacher={teacher}", *extra)


@pytest.fixture(scope="module")
def distilled(teacher, data, tmp_path_factory):
    """A two-step distillation run by `vidforge train` (the CLI), and the step object it trained with."""
    from vidforge.train import loop

    run_dir = tmp_path_factory.mktemp("distilled") / "run"
    args = ["train", "--data", str(data), "--run-dir", str(run_dir)]
    for s in (*TRAIN_SETS, *distill_sets(teacher, "train.steps=2")):
        args += ["--set", s]
    made = []

    def keep(*a, **kw):
        made.append(make_train_step(*a, **kw))
        return made[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, "make_train_step", keep)
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return run_dir, made[0]


def test_each_step_updates_the_fake_score_k_times_then_the_student_once(distilled) -> None:
    """DMD2's two time-scale rule: with fake_updates=2, two training steps are two student updates and
    four of the fake score (AdamW's own step counts)."""
    _, step = distilled
    student_steps = {int(s["step"]) for s in step.parts.optimizers[0].state.values()}
    fake_steps = {int(s["step"]) for s in step.fake_optimizer.state.values()}
    assert student_steps == {2} and fake_steps == {4} and step.fake_updates_done == 4


def test_a_resumed_distillation_continues_as_the_uninterrupted_one(
    distilled, teacher, data, tmp_path
) -> None:
    """One step, a checkpoint, --resume for the second: the losses, the fake score's losses and the
    exported student equal the uninterrupted run's, bit for bit."""
    from safetensors.torch import load_file

    from vidforge.train.loop import run

    whole, _ = distilled
    part = tmp_path / "part"
    run(train_profile(*distill_sets(teacher, "train.steps=1")), [data], part)
    run(train_profile(*distill_sets(teacher, "train.steps=2")), [data], part, resume=True)
    assert losses(part) == losses(whole)
    assert fake_losses(part) == fake_losses(whole)
    a, b = load_file(whole / "export/model.safetensors"), load_file(part / "export/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def fake_losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["fake_loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_infer_samples_the_distilled_student_in_its_steps_without_flags(distilled, tmp_path) -> None:
    """`vidforge infer` on the run with no sampling flags: two model calls for a batch of two prompts
    (the student's two levels, no guidance branch)."""
    run_dir, _ = distilled
    out = infer_run.run(run_dir, ["a red ball", "a blue cube"], tmp_path / "videos")
    assert len(out.videos) == 2
    assert out.model_calls == 2
    record = json.loads((tmp_path / "videos" / "samples.jsonl").read_text().splitlines()[0])
    assert (record["sampler"], record["steps"], record["guidance"]) == ("few-step", 2, 1.0)


def test_a_distillation_without_a_teacher_says_where_to_give_it(data, tmp_path) -> None:
    from vidforge.train.loop import run

    with pytest.raises(UserInputError, match="train.distill.teacher"):
        run(train_profile(*SMALL, *DISTILL), [data], tmp_path / "r")


def test_a_lora_student_and_fake_score_train_their_adapters_alone(teacher, data, tmp_path) -> None:
    """train.lora under train.distill: one step moves the student's and the fake score's adapters, their
    base weights stay the teacher's, and the teacher carries no adapters at all. `infer -c TEACHER --lora`
    samples the exported student adapter in the student's two steps."""
    from vidforge.parallel.runtime import init_runtime
    from vidforge.train.build import build
    from vidforge.train.distill import student_profile
    from vidforge.train.init_weights import WeightsInit
    from vidforge.train.loop import rank_batcher

    profile = student_profile(
        train_profile(*distill_sets(teacher, "train.distill.fake_updates=1", "train.lora.rank=4"))
    )
    runtime = init_runtime(profile)
    parts = build(profile, runtime, WeightsInit(teacher), WeightsInit(teacher))
    step = make_train_step(profile, runtime, parts)
    student, fake = parts.modules[0], parts.fake_score

    def snapshot(module):
        return {name: p.detach().clone() for name, p in module.named_parameters()}

    before = {"student": snapshot(student), "fake": snapshot(fake), "teacher": snapshot(parts.teacher)}
    batcher = rank_batcher(profile, runtime, [data])
    try:
        result = step(step.next_batches(batcher))
    finally:
        getattr(batcher, "close", lambda: None)()
    assert result.finite and result.loss > 0
    step.apply()
    assert not any("lora_" in name for name in before["teacher"])
    assert all(torch.equal(p, before["teacher"][n]) for n, p in parts.teacher.named_parameters())
    for name, module in (("student", student), ("fake", fake)):
        moved = {n for n, p in module.named_parameters() if not torch.equal(p, before[name][n])}
        trainable = {n for n, p in module.named_parameters() if p.requires_grad}
        assert moved and moved <= trainable and all("lora_" in n for n in trainable), name
    from vidforge.train.export import export_weights

    adapter = export_weights(profile, parts.modules, None, tmp_path / "adapter", 1, base=str(teacher))
    out = infer_run.run(teacher, ["a red ball"], tmp_path / "videos", lora=adapter)
    assert out.model_calls == 2

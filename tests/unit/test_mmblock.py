"""Vchitect-2.0's multimodal parallel block (model.stdit_block=parallel-mm): every branch reads the
caption; the block equals a direct computation from the equations; started from an image model's
weights it is that image model at step 0; a few `vidforge train` steps with it keep finite losses
(that one lives in test_train_loop.py, beside the trained fixtures it shares)."""

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_models_dit import _perturbed  # noqa: E402  (every parameter off its partly zero init)

from vidforge.families.vidforge.mmblock import GATES, MMParallelBlock, video_state_from_image  # noqa: E402
from vidforge.models import build_model, model_config  # noqa: E402
from vidforge.models.rope import apply_rope, axis_dims  # noqa: E402
from vidforge.profile import ProfileError, load_profile  # noqa: E402

GRID = (3, 2, 3)  # token frames, rows, columns
TEXT = 5


def _setup(seed=0, grid=GRID, batch=2, **overrides):
    cfg = model_config("tiny", architecture="stdit", stdit_block="parallel-mm", **overrides)
    torch.manual_seed(seed)
    model = _perturbed(build_model(cfg, dtype=torch.float64), scale=0.1, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    tokens = math.prod(grid)
    x = torch.randn(batch, tokens, cfg.hidden, generator=g, dtype=torch.float64)
    noise = torch.randn(batch, generator=g, dtype=torch.float64)
    text = torch.randn(batch, TEXT, cfg.text_dim, generator=g, dtype=torch.float64)
    mask = torch.ones(batch, TEXT, dtype=torch.bool)
    mask[0, 3:] = False  # the first caption is padded: its last two tokens must not be keys
    return model, x, noise, text, mask


def test_every_branch_output_depends_on_the_caption():
    model, x, noise, text, mask = _setup()
    block = model.blocks["0"]
    other = torch.randn_like(text)
    outs = [
        block.branch_outputs(x, model.condition(noise, t, mask, batch=2, grid=GRID))[0] for t in (text, other)
    ]
    assert set(outs[0]) == {"spatial", "temporal", "full"}
    for name in outs[0]:
        difference = (outs[0][name] - outs[1][name]).abs()
        # Every token of every branch, not just some: each query attends to its sample's caption.
        assert difference.amax(dim=-1).min() > 1e-4, name


def _reference(block, x, cond, mask):
    """The block from its equations, one sample at a time, with explicit group masks from positions."""
    heads, dim = block.spatial_attn.heads, block.spatial_attn.head_dim
    positions = cond.positions
    same = {
        "spatial": positions[:, None, 0] == positions[None, :, 0],
        "temporal": (positions[:, None, 1:] == positions[None, :, 1:]).all(-1),
        "full": torch.ones(len(positions), len(positions), dtype=torch.bool),
    }
    cos, sin = cond.rope
    t_pairs = axis_dims(dim)[0] // 2
    rope = {"temporal": (cos, sin), "full": (cos, sin)}
    # The spatial branch rotates by (h, w) only: angle 0 on the t channels.
    rope["spatial"] = (torch.cat([torch.ones_like(cos[:, :t_pairs]), cos[:, t_pairs:]], 1), sin.clone())
    rope["spatial"][1][:, :t_pairs] = 0

    def layer_norm(v):
        return F.layer_norm(v, v.shape[-1:], eps=1e-6)

    def heads_of(v):
        return v.reshape(v.shape[0], heads, dim)

    outputs = []
    for b in range(x.shape[0]):
        p = block.modulation.proj(F.silu(cond.time[b])).chunk(block.chunks)
        text = torch.cat([cond.text[b][mask[b]], block.context_latents])
        c = layer_norm(text) * (1 + p[7]) + p[6]
        h = layer_norm(x[b]) * (1 + p[1]) + p[0]
        xb = x[b].clone()
        for name, group in same.items():
            attn = getattr(block, f"{name}_attn")
            rc, rs = rope[name]
            q = apply_rope(attn.q_norm(heads_of(attn.q(h)))[None], rc, rs)[0]
            k = apply_rope(attn.k_norm(heads_of(attn.k(h)))[None], rc, rs)[0]
            v = heads_of(attn.v(h))
            keys = torch.cat([k, attn.text_k_norm(heads_of(attn.text_k(c)))])
            values = torch.cat([v, heads_of(attn.text_v(c))])
            allowed = torch.cat([group, torch.ones(len(h), len(text), dtype=torch.bool)], 1)
            scores = torch.einsum("qhd,khd->hqk", q, keys) / math.sqrt(dim)
            weights = torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1)
            out = torch.einsum("hqk,khd->qhd", weights, values).reshape(len(h), -1)
            xb = xb + p[GATES[name]] * attn.out(out)
        inner = layer_norm(xb) * (1 + p[4]) + p[3]
        mlp = block.mlp.fc2(F.gelu(block.mlp.fc1(inner), approximate="tanh"))
        outputs.append(xb + p[5] * mlp)
    return torch.stack(outputs)


@pytest.mark.parametrize("backend", ["sdpa", "dense"])
def test_block_equals_a_direct_computation_of_its_equations(backend):
    model, x, noise, text, mask = _setup(attention=backend)
    block = model.blocks["0"]
    cond = model.condition(noise, text, mask, batch=2, grid=GRID)
    expected = _reference(block, x, cond, mask)
    torch.testing.assert_close(block(x, cond), expected, rtol=1e-10, atol=1e-10)


def test_started_from_an_image_model_it_is_that_image_model_on_every_frame_at_step_0():
    """ "Image model" here: the same block with the spatial branch only (MMParallelBlock(video=False):
    per-frame joint attention with the caption, and the MLP), run on each frame alone as a one-frame
    clip. The video block takes its weights (video_state_from_image): its temporal and full branches
    keep their random attention weights but their gates start at zero."""
    model, x, noise, text, mask = _setup()
    image = _perturbed(MMParallelBlock(model.config, video=False).double(), scale=0.1, seed=3)
    video = MMParallelBlock(model.config).double()
    video.load_state_dict(video_state_from_image(image.state_dict(), video))
    out = video(x, model.condition(noise, text, mask, batch=2, grid=GRID))
    t, hw = GRID[0], GRID[1] * GRID[2]
    frame_cond = model.condition(noise, text, mask, batch=2, grid=(1, *GRID[1:]))
    frames = [image(x[:, i * hw : (i + 1) * hw], frame_cond) for i in range(t)]
    torch.testing.assert_close(out, torch.cat(frames, dim=1), rtol=1e-12, atol=1e-12)
    # The new branches are not dead: their outputs are non-zero and their gates get a gradient.
    outs, _ = video.branch_outputs(x, model.condition(noise, text, mask, batch=2, grid=GRID))
    assert outs["temporal"].abs().amin(-1).min() > 0 and outs["full"].abs().amin(-1).min() > 0
    out.square().sum().backward()
    rows = video.modulation.proj.weight.grad.chunk(video.chunks)
    assert rows[GATES["temporal"]].abs().sum() > 0 and rows[GATES["full"]].abs().sum() > 0


def test_image_weights_of_another_shape_are_refused():
    model, *_ = _setup()
    video = MMParallelBlock(model.config)
    wider = MMParallelBlock(model_config("tiny", hidden=48, heads=4), video=False)
    with pytest.raises(ValueError, match="image weights: .* is"):
        video_state_from_image(wider.state_dict(), video)


@pytest.mark.parametrize("field", ["tp", "cp"])
def test_profile_with_tensor_or_context_parallel_is_refused(field):
    sets = ["model.architecture=stdit", "model.stdit_block=parallel-mm", "cluster.cpu_processes=2"]
    sets += [f"parallel.{field}=2", "parallel.cp_impl=all-gather"]
    with pytest.raises(ProfileError, match=f"parallel.{field}=2: model.stdit_block=parallel-mm has no"):
        load_profile("local_cpu", sets)

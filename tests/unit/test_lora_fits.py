"""What makes a LoRA run fit a small GPU: the frozen base in float8 (`train.lora.fp8_base`,
`vidforge.memory_savers.fp8_base`) and block swap (`train.lora.blocks_to_swap`, `vidforge.memory_savers.block_swap`),
each through `vidforge train`'s own build and step (`BenchStep`) on the CPU."""

from __future__ import annotations

import pytest
import torch
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

from vidforge.bench.train_bench import BenchStep
from vidforge.memory_savers.activation_offload import OffloadedBlock
from vidforge.memory_savers.block_swap import SwappedBlock
from vidforge.memory_savers.fp8_base import E4M3, Float8BaseLinear, dequantize, max_abs_error, quantize
from vidforge.profile import load_profile

TINY_WAN = [
    "model.preset=wan2.1-1.3b",
    "model.layers=4",
    "model.abs_position=none",
    "model.hidden=64",
    "model.heads=4",
    "model.mlp_hidden=128",
    "model.text_dim=32",
    "bench.latent_frames=2",
    "bench.latent_height=8",
    "bench.latent_width=8",
    "bench.text_tokens=8",
    "train.warmup_steps=0",
    "train.steps=10",
    "train.lr=1e-2",
    "train.lora={rank: 4, alpha: 8}",
]
# The stated error of the float8 base on the tiny Wan: its first loss within this of the bf16 base's.
OUTPUT_ERROR = 0.05


def _losses(sets: list[str], steps: int = 3) -> tuple[list[float], BenchStep]:
    torch.manual_seed(0)
    bench = BenchStep(load_profile(None, [*TINY_WAN, *sets]))
    out = []
    for _ in range(steps):
        out.append(bench.step(bench.batches).loss)
        bench.step.apply()
    return out, bench


@pytest.mark.parametrize("scaling", ["row", "tensor"])
def test_quantized_weights_stay_within_the_e4m3_bound(scaling: str) -> None:
    torch.manual_seed(0)
    weight = torch.randn(96, 64) * torch.logspace(-3, 0, 64)  # columns over three decades: subnormals too
    values, scale = quantize(weight, scaling)
    assert values.dtype == E4M3 and scale.shape == ((96, 1) if scaling == "row" else (1, 1))
    error = (dequantize(values, scale, torch.float32) - weight).abs()
    assert (error <= max_abs_error(weight, scale)).all()
    # independent check of the bound's size: e4m3 keeps 3 mantissa bits, a relative 1/16 at most
    big = weight.abs() > scale * 2.0**-6
    assert (error[big] / weight.abs()[big]).max() <= 2.0**-4


def test_fp8_linear_gives_the_gradient_of_its_dequantized_weight() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(32, 16).requires_grad_(False)
    fp8 = Float8BaseLinear(linear, "row")
    reference = nn.Linear(32, 16).requires_grad_(False)
    reference.weight.copy_(dequantize(fp8.weight, fp8.weight_scale, torch.float32))
    reference.bias.copy_(linear.bias)
    x = torch.randn(8, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    torch.testing.assert_close(fp8(x), reference(x2), rtol=0, atol=0)
    fp8(x).square().sum().backward()
    reference(x2).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


def test_fp8_base_halves_the_blocks_and_stays_near_the_bf16_base() -> None:
    bf16, _ = _losses(["train.precision=bf16"], steps=1)
    fp8, conv = _losses(["train.precision=bf16", "train.lora.fp8_base=true"], steps=1)
    model = conv.parts.modules[0]
    converted = [m for m in model.modules() if isinstance(m, Float8BaseLinear)]
    assert converted and all(m.weight.dtype == torch.uint8 for m in converted)
    adapters = [p for p in model.parameters() if p.requires_grad]
    assert adapters and all(p.dtype == torch.float32 for p in adapters)
    # the same batch, noise and adapters: the loss and the adapters' gradient move by a few percent
    assert fp8[0] == pytest.approx(bf16[0], rel=OUTPUT_ERROR)


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["train.activation_checkpointing=full"],
        ["train.lora.fp8_base=true", "train.activation_offload=0.5"],
    ],
    ids=["plain", "full-recompute", "fp8-offload"],
)
def test_block_swap_keeps_the_losses_bit_for_bit(sets: list[str]) -> None:
    reference, _ = _losses(sets)
    swapped, bench = _losses([*sets, "train.lora.blocks_to_swap=2"])
    assert swapped == reference
    model = bench.parts.modules[0]
    assert [k for k, b in model.blocks.items() if isinstance(b, SwappedBlock)] == ["2", "3"]
    # the schedule of one step: forward 2 then 3 (3 fetched while 2 computes), backward 3 then 2 (2
    # fetched while 3 computes), each block sent back once the next one is in
    swapper = next(b for b in model.blocks.values() if isinstance(b, SwappedBlock)).swapper
    swapper.log.clear()
    bench.step(bench.batches)
    assert swapper.log == [
        ("in", 2),  # still on the device from the previous backward
        ("fetch", 3),
        ("in", 3),
        ("out", 2),
        ("in", 3),  # backward: 3 first
        ("fetch", 2),
        ("in", 2),
        ("out", 3),
    ]


def test_checkpoint_offload_keeps_the_losses_bit_for_bit() -> None:
    """train.checkpoint_offload: each checkpointed block's input waits on the host (an OffloadedBlock
    around the checkpoint), and the losses are the recompute's own, with block swap around both."""
    full = ["train.activation_checkpointing=full"]
    reference, _ = _losses(full)
    offloaded, bench = _losses([*full, "train.checkpoint_offload=true", "train.lora.blocks_to_swap=2"])
    assert offloaded == reference
    blocks = list(bench.parts.modules[0].blocks.values())
    inner = [b._checkpoint_wrapped_module if isinstance(b, SwappedBlock) else b for b in blocks]
    assert all(isinstance(b, OffloadedBlock) for b in inner)
    assert all(type(b._checkpoint_wrapped_module).__name__ == "CheckpointWrapper" for b in inner)


def test_adapters_read_their_input_as_it_is_under_autocast() -> None:
    """peft casts an adapter's bf16 input to the adapter's float32 (and autocast casts it back): the
    same values in a copy each adapter keeps. vidforge skips that cast under autocast; the losses are
    those of peft's own cast, bit for bit, and the step saves less."""
    ours, bench = _losses(["train.precision=bf16"], steps=2)  # the second after an update
    saved = bench.measure_memory()["activations"]
    torch.manual_seed(0)
    peft_cast = BenchStep(load_profile(None, [*TINY_WAN, "train.precision=bf16"]))
    for module in peft_cast.parts.modules[0].modules():
        if isinstance(module, BaseTunerLayer):
            module.cast_input_dtype_enabled = True  # peft's default
    theirs = []
    for _ in range(2):
        theirs.append(peft_cast.step(peft_cast.batches).loss)
        peft_cast.step.apply()
    assert ours == theirs
    assert saved < peft_cast.measure_memory()["activations"]


@pytest.mark.parametrize(
    ("layout", "rel"),
    [([], 1e-9), (["cluster.accelerator.kind=cpu", "cluster.cpu_processes=2", "parallel.dp_shard=2"], 0.01)],
    ids=["one-process", "fsdp2"],
)
def test_the_dry_run_counts_the_host_as_the_plan_does(layout: list[str], rel: float) -> None:
    """Every swapped block's frozen weights stay pinned on the host, two of them also on the device at
    once (under FSDP2 each rank's shards, with the blocks' adapters and their AdamW states): the dry run
    (from the tensors it built) and the memory model agree, to the total, and both name what the offloads
    keep on the host. FSDP2 shards a tensor's first dimension: rank 0 holds a block's (1, 6, hidden)
    modulation table whole where the model counts half (0.4% of the host bytes here), hence rel 1%."""
    from vidforge.estimate.memory_model import estimate_memory
    from vidforge.train.dry_run import dry_run

    sets = ["train.precision=bf16", "train.lora.blocks_to_swap=3", "train.activation_checkpointing=full"]
    profile = load_profile(None, [*TINY_WAN, *sets, "train.checkpoint_offload=true", *layout])
    stage, estimate = dry_run(profile).stages[0], estimate_memory(profile)
    assert stage.host_bytes == pytest.approx(estimate.host_bytes, rel=rel) and estimate.host_bytes > 0
    # the model's "parameters": the frozen base's term and the adapters' fp32 weights
    assert stage.parameter_bytes == pytest.approx(estimate.get("parameters"), rel=rel)
    assert stage.total_bytes == pytest.approx(estimate.total, rel=rel)
    assert stage.offloaded_bytes == estimate.offloaded_bytes == estimate.offloaded_input_bytes > 0

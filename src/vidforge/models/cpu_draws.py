"""Random initialisation drawn from torch's CPU generator whatever device the weights live on, so that a
seed gives the same weights on a GPU as on the CPU.

A CUDA generator seeded with the same number draws another stream than the CPU's (Philox against the
Mersenne twister), so a model initialised on the GPU started from other weights than the same run on the
CPU, and left the CPU generator, which the training loss then draws its noise from, elsewhere: the GPU
suite's fp32 run on CUDA began at loss 1.0798 where the CPU run began at 0.9989. Under `CpuDraws` every
random fill or factory aimed at another device is drawn on the CPU in the same order and copied over, one
tensor at a time (the CPU never holds the whole model). The meta device draws nothing (it holds no
values), and a call given its own generator keeps it.

The CPU's generator is serial: a model's initialisation draws about two numbers a parameter (each
Linear's own reset, then the model's init), measured at 24 M parameters/s on a loaded 2-core machine
(a 3-block Wan2.1-1.3B, 165 M parameters, in 6.9 s). So only models of up to `MAX_PARAMETERS` are drawn on
the CPU: every model a CPU can train, which are the ones a GPU run is compared with. A larger one (the
1.3B Wan has 1.42 B parameters, 14B ones far more) draws on its device, in no time, and its weights
depend on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# in-place random fills: every one overwrites the whole tensor
_FILLS = frozenset(
    {
        aten.uniform_.default,
        aten.normal_.default,
        aten.bernoulli_.float,
        aten.random_.default,
        getattr(aten.random_, "from"),
        aten.random_.to,
        aten.exponential_.default,
        aten.log_normal_.default,
        aten.cauchy_.default,
        aten.geometric_.default,
    }
)
# random factories (device in their keyword arguments) and their `_like` forms (the input's device)
_FACTORIES = frozenset(
    {
        aten.randn.default,
        aten.rand.default,
        aten.randint.default,
        aten.randint.low,
        aten.randperm.default,
        aten.normal.float_float,
    }
)
_LIKE = frozenset(
    {aten.randn_like.default, aten.rand_like.default, aten.randint_like.default, aten.randint_like.low_dtype}
)


PASSTHROUGH = ("cpu", "meta")
MAX_PARAMETERS = 200_000_000
"""Models up to this size draw their initialisation on the CPU (seconds of draws); larger ones on their
device (see the module docstring)."""


def cpu_draws(device: torch.device | str | None, parameters: Callable[[], int]) -> AbstractContextManager:
    """`CpuDraws` for building a model of `parameters()` parameters on `device`; nothing where it would
    change nothing (the CPU, the meta device, None: the default, the CPU), as entering the mode the first
    time imports torch._dynamo (seconds), nor for a model above `MAX_PARAMETERS`."""
    if device is None or torch.device(device).type in PASSTHROUGH or parameters() > MAX_PARAMETERS:
        return nullcontext()
    return CpuDraws()


class CpuDraws(TorchDispatchMode):
    """Random fills and factories for devices other than `passthrough` drawn on the CPU and copied (see
    the module docstring). `passthrough` is ("cpu", "meta") for use; a test may narrow it to see the
    redirection work on the devices a CPU machine has."""

    def __init__(self, passthrough: tuple[str, ...] = PASSTHROUGH) -> None:
        super().__init__()
        self.passthrough = passthrough

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if kwargs.get("generator") is not None:
            return func(*args, **kwargs)
        if func in _FILLS:
            target = args[0]
            if target.device.type in self.passthrough:
                return func(*args, **kwargs)
            host = torch.empty(target.shape, dtype=target.dtype, device="cpu")
            func(host, *args[1:], **kwargs)
            return target.copy_(host)
        if func in _FACTORIES or func in _LIKE:
            like = args[0] if func in _LIKE else None
            device = torch.device(kwargs.get("device") or (like.device if like is not None else "cpu"))
            if device.type in self.passthrough:
                return func(*args, **kwargs)
            if like is not None:
                args = (torch.empty(like.shape, dtype=like.dtype, device="cpu"), *args[1:])
            return func(*args, **{**kwargs, "device": torch.device("cpu")}).to(device)
        return func(*args, **kwargs)

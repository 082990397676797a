"""What trades time for device memory in a training step, each a profile knob applied to a built network
from outside: activation checkpointing per block (activation_checkpoint.py: `train.activation_checkpointing`),
activations offloaded to the host (activation_offload.py: `train.activation_offload`,
`train.checkpoint_offload`), a frozen LoRA base stored in float8 (fp8_base.py: `train.lora.fp8_base`) and
its blocks swapped in from the host (block_swap.py: `train.lora.blocks_to_swap`). None of it is
parallelism: `parallel.parallelize` and `train.build` apply them in their order, and the memory model
(`vidforge.estimate`) counts them through the same functions (which blocks recompute, which offload)."""

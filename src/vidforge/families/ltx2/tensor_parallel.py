"""LTX-2 under tensor parallel: not built yet. Its block would split like Wan's (to_q/to_k/to_v and
ff.net.0.proj column-wise, to_out.0 and ff.net.2 row-wise), but q/k RMSNorm runs across all heads (a
statistic over the whole width, which a column split cuts) and RoPE rotates the whole width before the
heads split, so a plan needs a sharded norm and rotary table; nothing holds one to one process yet, so a
layout with tp > 1 is refused."""

from __future__ import annotations

from typing import Any

from vidforge.errors import UserInputError


def apply_tp(model: Any, tp_mesh: Any, sequence_parallel: bool = False) -> None:
    raise UserInputError(
        f"parallel.tp={tp_mesh.size()}: tensor parallel is not built for model.family=ltx2 yet; set "
        "parallel.tp=1 (shard the weights with FSDP: parallel.dp_shard)"
    )

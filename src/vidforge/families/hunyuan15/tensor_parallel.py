"""HunyuanVideo-1.5 under tensor parallel: not built yet. The double-stream block would split like
Wan's (q/k/v and add_q/k/v_proj, ff.net.0.proj and ff_context.net.0.proj column-wise; to_out.0,
to_add_out, ff.net.2 and ff_context.net.2 row-wise; the per-head RMSNorms need nothing from other ranks),
but nothing holds such a plan to one process yet, so a layout with tp > 1 is refused."""

from __future__ import annotations

from typing import Any

from vidforge.errors import UserInputError


def apply_tp(model: Any, tp_mesh: Any, sequence_parallel: bool = False) -> None:
    raise UserInputError(
        f"parallel.tp={tp_mesh.size()}: tensor parallel is not built for model.family=hunyuan15 yet; set "
        "parallel.tp=1 (shard the weights with FSDP: parallel.dp_shard)"
    )

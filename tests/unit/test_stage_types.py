"""The curation pipelines are typed: each stage declares what it takes and hands on (`Stage[In, Out]`), each
stage's `Out` is what the next one takes, and each stage's `process` is annotated with its declared types (so
the declaration is the code's, not a comment)."""

from __future__ import annotations

import types
import typing
from pathlib import Path

import pytest

from vidforge.curate.captioning.stages import AnnotateStage, Decoded, DecodeStage
from vidforge.curate.clip import build_stages
from vidforge.curate.clipping.decode import AnalyseStage
from vidforge.curate.clipping.plan import PlanStage
from vidforge.curate.clipping.transcode import TranscodeStage
from vidforge.curate.embeddings.embedder import EmbedStage
from vidforge.curate.embeddings.semdedup import PairStage
from vidforge.curate.stage import Stage
from vidforge.profile.caption import Caption
from vidforge.profile.curation import Curation


def io_types(cls: type) -> tuple[set[type], set[type]]:
    """(In, Out) of a Stage subclass as sets of classes (a union opened up)."""
    for base in getattr(cls, "__orig_bases__", ()):
        if typing.get_origin(base) is Stage:
            return tuple(_members(arg) for arg in typing.get_args(base))  # type: ignore[return-value]
    raise AssertionError(f"{cls.__name__} does not declare Stage[In, Out]")


def _members(tp: object) -> set[type]:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return {m for arg in typing.get_args(tp) for m in _members(arg)}
    return {typing.get_origin(tp) or tp}


def chain_problems(stages: list[Stage]) -> list[str]:
    problems = []
    for a, b in zip(stages, stages[1:], strict=False):
        out, takes = io_types(type(a))[1], io_types(type(b))[0]
        if not out <= takes:
            problems.append(f"{a.name} hands on {out - takes}, which {b.name} does not take")
    return problems


def test_the_clip_pipeline_chains(tmp_path: Path) -> None:
    stages = build_stages(Curation(embed=True), tmp_path, sources=1)
    assert [type(s) for s in stages] == [AnalyseStage, PlanStage, TranscodeStage, EmbedStage]
    assert io_types(AnalyseStage)[0] == {str}  # a source: a path or URL
    assert chain_problems(stages) == []


def test_the_caption_pipeline_chains(tmp_path: Path) -> None:
    stages = [DecodeStage(Caption(), tmp_path), AnnotateStage(Caption(), tmp_path, load_models=False)]
    assert io_types(DecodeStage) == ({dict}, {Decoded})
    assert chain_problems(stages) == []


def test_the_chain_check_sees_a_mismatch(tmp_path: Path) -> None:
    """Transcode hands on clips, not an Analysis: plan after transcode does not chain."""
    cfg = Curation()
    stages = [TranscodeStage(cfg, tmp_path, samples=0), PlanStage(cfg)]
    assert len(chain_problems(stages)) == 1


@pytest.mark.parametrize(
    "cls", [AnalyseStage, PlanStage, TranscodeStage, EmbedStage, DecodeStage, AnnotateStage, PairStage]
)
def test_process_is_annotated_with_the_declared_types(cls: type) -> None:
    takes, out = io_types(cls)
    method = cls.process_batch if "process_batch" in cls.__dict__ else cls.process
    hints = typing.get_type_hints(method)
    arg = next(v for k, v in hints.items() if k != "return")
    got_in, got_out = (
        _members(typing.get_args(arg)[0] if method.__name__ == "process_batch" else arg),
        hints["return"],
    )
    if typing.get_origin(got_out) is list:
        got_out = typing.get_args(got_out)[0]
    assert got_in == takes
    assert _members(got_out) == out

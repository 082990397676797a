"""Clip stages in isolation: shots equal PySceneDetect's own, stitching follows similarity, duration and
static policies against closed-form answers, dedup, input expansion, the generic executor."""

from __future__ import annotations

import os

import numpy as np
import pytest
from scenedetect import AdaptiveDetector, ContentDetector, detect

from vidforge.curate import clip as clip_module
from vidforge.curate.clipping.decode import analyse
from vidforge.curate.clipping.duration import apply_duration
from vidforge.curate.clipping.static import static_ratio
from vidforge.curate.clipping.stitch import stitch_shots
from vidforge.curate.embeddings.greedy_dedup import near_duplicates
from vidforge.curate.executors.local import LocalExecutor, usable_cores
from vidforge.curate.inputs import expand_inputs
from vidforge.curate.items import Shot
from vidforge.curate.stage import ItemError, Stage
from vidforge.errors import UserInputError
from vidforge.profile.curation import Curation


@pytest.mark.parametrize("detector", ["adaptive", "content"])
def test_cuts_equal_scenedetect_detect(sample_videos, detector):
    cfg = Curation(detector=detector, stitch=False)
    reference = AdaptiveDetector if detector == "adaptive" else ContentDetector
    for name in ("cuts", "fade_text", "false_split", "static", "red_square"):
        path = str(sample_videos / f"{name}.mp4")
        theirs = [start.frame_num for start, _ in detect(path, reference())][1:]
        ours = [shot.start for shot in analyse(path, cfg).shots][1:]
        assert ours == theirs, name


def test_detector_settings_reach_the_detector(sample_videos):
    path = str(sample_videos / "cuts.mp4")
    cfg = Curation(adaptive_threshold=30.0, stitch=False)
    theirs = [s.frame_num for s, _ in detect(path, AdaptiveDetector(adaptive_threshold=30.0))][1:]
    assert [s.start for s in analyse(path, cfg).shots][1:] == theirs
    assert len(theirs) < 3  # a threshold this high misses cuts the default finds


def test_static_flags_follow_the_generator_truth(sample_videos, sample_truth):
    truth = sample_truth["static"]
    a = analyse(str(sample_videos / "static.mp4"), Curation(stitch=False))
    ((s, e),) = truth["static_spans"]
    assert a.static[s:e].all()
    assert not a.static[1:s].any() and not a.static[e:].any()
    assert static_ratio(a.static, 30, 78) == pytest.approx((e - s) / (78 - 31))


def _fake_pooled(frames):
    """A stand-in embedder: the mean colour, normalised. Same content -> cosine ~1."""
    v = frames.reshape(len(frames), -1, 3).mean(axis=(0, 1)) - 100.0
    return v / np.linalg.norm(v)


def test_stitch_merges_exactly_when_similarity_reaches_threshold():
    shots = [Shot(0, 20), Shot(20, 40), Shot(40, 60)]
    red, blue = np.array([250, 10, 10], np.uint8), np.array([10, 10, 250], np.uint8)
    frames = {i: np.broadcast_to(red if i < 40 else blue, (4, 4, 3)).copy() for i in range(60)}
    merged, sims = stitch_shots(shots, frames, 8, 0.9, _fake_pooled)
    assert sims[0] == pytest.approx(1.0) and sims[1] < 0.9
    assert [(s.start, s.end, s.merged) for s in merged] == [(0, 40, 2), (40, 60, 1)]
    merged, _ = stitch_shots(shots, frames, 8, sims[0] + 1e-3, _fake_pooled)
    assert len(merged) == 3


@pytest.mark.parametrize(
    ("start", "end", "fps", "lo", "hi", "trim", "expected"),
    [
        (0, 100, 10, 1.0, 4.0, 0.0, [(0, 33), (33, 67), (67, 100)]),  # 10 s -> 3 even pieces of <= 4 s
        (0, 40, 10, 1.0, 4.0, 0.0, [(0, 40)]),
        (0, 9, 10, 1.0, 4.0, 0.0, []),  # 0.9 s < 1 s
        (10, 40, 10, 1.0, 4.0, 0.5, [(15, 35)]),
        (0, 24, 10, 2.0, 4.0, 0.3, []),  # 1.8 s after trimming
    ],
)
def test_duration_policy(start, end, fps, lo, hi, trim, expected):
    spans, reason = apply_duration(start, end, fps, lo, hi, trim)
    assert spans == expected
    assert (reason is None) == bool(expected)
    for a, b in spans:
        assert (b - a) / fps <= hi + 1e-9


def test_dedup_drops_later_near_duplicates():
    e = np.eye(3, dtype=np.float32)
    e = np.vstack([e[0], e[1], (e[0] + 0.05 * e[2]) / np.linalg.norm(e[0] + 0.05 * e[2]), e[2]])
    assert set(near_duplicates(e, 0.99)) == {2}
    assert near_duplicates(e, 0.99)[2][0] == 0
    assert near_duplicates(e, 1.01) == {}


def test_expand_inputs(tmp_path, sample_videos):
    (tmp_path / "a").mkdir()
    for name in ("x.mp4", "a/y.MOV", "a/notes.txt.bak"):
        (tmp_path / name).write_bytes(b"")
    listing = tmp_path / "list.txt"
    listing.write_text("# a comment\nx.mp4\n")
    exts = Curation().extensions
    assert expand_inputs([str(tmp_path / "a")], exts) == [str((tmp_path / "a/y.MOV").resolve())]
    assert expand_inputs([str(listing)], exts) == [str((tmp_path / "x.mp4").resolve())]
    assert len(expand_inputs([str(tmp_path / "**/*.mp4"), str(tmp_path / "x.mp4")], exts)) == 1
    with pytest.raises(UserInputError, match="no such file"):
        expand_inputs([str(tmp_path / "missing.mp4")], exts)
    with pytest.raises(UserInputError, match="matches no files"):
        expand_inputs([str(tmp_path / "*.mkv")], exts)


class _Split(Stage):
    name, kind, workers = "split", "thread", 1

    def process(self, n):
        if n == 3:
            raise ItemError("three is bad")
        return list(range(n)) if n else None


class _Square(Stage):
    name, kind, workers = "square", "process", 0

    def process(self, x):
        return x * x


def test_executor_fans_out_collects_units_and_records_errors():
    done = {}
    stats = LocalExecutor(queue_depth=1).run(
        [_Split(), _Square()],
        [(f"u{n}", n) for n in range(5)],
        lambda u, r, e: done.update({u: (sorted(r), e)}),
    )
    assert done["u0"] == ([], [])
    assert done["u4"] == ([0, 1, 4, 9], [])
    assert done["u3"] == ([], [{"stage": "split", "reason": "three is bad"}])
    assert stats.units == 5 and stats.stages[0].errors == 1


class _WhereRun(Stage):
    """Odd items are cheap enough for the driver; every item reports the process that ran it."""

    name = "where"
    kind = "process"

    def runs_in_driver(self, item):
        return item % 2 == 1

    def process(self, item):
        return (item, os.getpid())


def test_items_cheap_for_the_driver_run_there_and_others_in_workers():
    done = {}
    LocalExecutor(queue_depth=1).run(
        [_WhereRun()], [(f"u{n}", n) for n in range(4)], lambda u, r, e: done.update({u: r[0]})
    )
    assert {item for item, pid in done.values() if pid == os.getpid()} == {1, 3}


DRIVER_STATE = "fresh"  # what a worker that imported this module itself sees


class _WhatWorkerSees(Stage):
    name = "sees"
    kind = "process"

    def process(self, item):
        return (os.getppid(), DRIVER_STATE)


def test_workers_do_not_inherit_the_driver_state():
    # A worker forked from the driver would carry its threads, CUDA context and globals: it must start
    # from a clean process (the forkserver) whatever the driver did before.
    global DRIVER_STATE
    DRIVER_STATE = "changed by the driver"
    done = {}
    try:
        LocalExecutor(queue_depth=1).run([_WhatWorkerSees()], [("u", 0)], lambda u, r, e: done.update({u: r}))
    finally:
        DRIVER_STATE = "fresh"
    [(parent, state)] = done["u"]
    assert state == "fresh" and parent != os.getpid()


def test_a_stage_whose_items_all_run_in_the_driver_starts_no_worker():
    class Cheap(_WhereRun):
        def runs_in_driver(self, item):
            return True

    executor = LocalExecutor(queue_depth=1)
    started = []
    make_pool = executor._make_pool
    executor._make_pool = lambda stage: started.append(stage.name) or make_pool(stage)
    executor.run([Cheap()], [(f"u{n}", n) for n in range(3)], lambda u, r, e: None)
    assert started == []


def test_usable_cores_is_the_affinity_mask_not_the_machine():
    assert usable_cores() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "setting, cores, sources, expected",
    [
        ("auto", 8, 3, 3),  # never more processes than sources: each takes a whole source
        ("auto", 2, 6, 2),  # one per core
        ("auto", 4, 0, 1),
        (5, 2, 1, 5),  # an explicit count is kept as given
        (0, 8, 8, 0),  # inline, in the main process
    ],
)
def test_decode_workers_auto_is_a_process_per_core_at_most_one_per_source(
    monkeypatch, setting, cores, sources, expected
):
    monkeypatch.setattr(clip_module, "usable_cores", lambda: cores)
    assert clip_module.decode_workers(Curation(decode_workers=setting), sources) == expected


@pytest.mark.parametrize(
    "sets, executor, workers",
    [
        ({"stitch": False, "embed": False}, "local", 0),  # one source, no model: the driver analyses it
        ({"stitch": False, "embed": False}, "ray", 1),  # Ray's actors do the work, never the driver
        ({"stitch": True, "embed": False}, "local", 1),  # the driver holds torch: a worker forks, not it
        ({"stitch": False, "embed": True}, "local", 1),
        ({"stitch": False, "embed": False, "detector": "transnetv2"}, "local", 1),
        ({"stitch": False, "embed": False, "decode_workers": 1}, "local", 1),  # as given
    ],
)
def test_one_source_without_models_is_analysed_by_the_driver(monkeypatch, tmp_path, sets, executor, workers):
    """What it saves (a forkserver's imports before the first frame) is measured in docs/benchmarks.md;
    here, when: one source, the local executor, and nothing in the driver that a fork would break."""
    monkeypatch.setattr(clip_module, "usable_cores", lambda: 2)
    cfg = Curation(decode_device="cpu", **sets)
    assert clip_module.build_stages(cfg, tmp_path, 1, executor)[0].workers == workers
    if cfg.decode_workers == "auto":  # two sources: a worker each, whatever the driver holds
        assert clip_module.build_stages(cfg, tmp_path, 2, executor)[0].workers == 2

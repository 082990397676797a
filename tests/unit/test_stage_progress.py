"""Progress a user watches (issue 44 item 9): the executor's last report counts every item, so clip's and
caption's bars end at their totals (the last one read `transcode 7/8` with all 8 done); tokenize counts
samples against the index's total from its first report (it showed `0/?` per shard, and nothing for
minutes inside finetune)."""

from __future__ import annotations

from vidforge.curate.executors.local import LocalExecutor
from vidforge.curate.stage import Stage


class _Cheap(Stage):
    """Items cheap enough to run in the driver: the loop ends right after them, with no pass that reports."""

    def __init__(self, name: str):
        self.name = name

    def process(self, item):
        return item

    def runs_in_driver(self, item) -> bool:
        return True


def test_the_last_report_counts_every_item() -> None:
    reports: list[list[tuple[str, int]]] = []
    stages = [_Cheap("decode"), _Cheap("transcode")]
    LocalExecutor(queue_depth=1).run(
        stages,
        [(f"u{n}", n) for n in range(8)],
        lambda *a: None,
        lambda stats: reports.append([(s.name, s.items_done) for s in stats]),
    )
    assert reports[-1] == [("decode", 8), ("transcode", 8)]


def test_tokenize_counts_samples_against_the_index_total(tmp_path) -> None:
    from vidforge.data.shard_index import read_index
    from vidforge.data.sharding import run as shard_run
    from vidforge.data.store import StoreSettings
    from vidforge.data.testing import make_annotated_dir
    from vidforge.profile import load_profile
    from vidforge.tokenizers.tokenize import run as tokenize_run

    settings = [
        "data.buckets=[[48,64],[64,48],[64,64]]", "data.frame_buckets=[1,5,9]", "data.shard_max_samples=2",
        "data.val_fraction=0", "text_encoder.max_length=16", "tokenizer.spatial_compression=4",
        "data.token_budget=1024",
    ]  # fmt: skip
    profile = load_profile(None, settings)
    ann = make_annotated_dir(tmp_path / "ann", videos=2, images=1, rejected=0, frames=(6, 12))
    shard_run(profile, ann, tmp_path / "shards")
    total = read_index(tmp_path / "shards", StoreSettings.from_profile(profile.data)).samples
    seen: list[tuple[int, int]] = []
    tokenize_run(profile, tmp_path / "shards", tmp_path / "lat", on_sample=lambda d, t: seen.append((d, t)))
    assert total == 3 and len(seen) >= 2  # a report per batch, not per shard
    assert all(t == total for _, t in seen) and seen[-1][0] == total
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)

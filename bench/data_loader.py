"""Training loader throughput from local disk and from a local S3 server, against a step's demand.

    .venv/bin/python bench/data_loader.py [--shards 8] [--per-shard 48] [--step-ms 200] [--prefetch 2]

Prints one JSON line per measurement: samples/s and MB/s of the loader + packer reading latent shards
(sha256 checked) from a local folder, from moto's S3 server on 127.0.0.1 with a cold cache and with a
warm one; then the data wait of `--steps` steps that each take `--step-ms` (a sleep standing in for a
GPU step, which releases the GIL as a CUDA step does) with the batches loaded synchronously and with
`--prefetch` batches ahead."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--per-shard", type=int, default=48)
    ap.add_argument("--channels", type=int, default=16)
    ap.add_argument("--budget", type=int, default=4096, help="tokens per packed batch")
    ap.add_argument("--step-ms", type=float, default=200.0)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prefetch", type=int, default=2)
    args = ap.parse_args()

    import fsspec
    from moto.server import ThreadedMotoServer

    from vidforge.data.batching import Packer
    from vidforge.data.loader import ShardLoader
    from vidforge.data.prefetch import Prefetcher
    from vidforge.data.shard_index import read_index
    from vidforge.data.store import Remote, StoreSettings, upload
    from vidforge.data.testing import make_latent_shards

    def report(name: str, **fields) -> None:
        print(json.dumps({"measure": name, **fields}), flush=True)

    shapes = ((5, 16, 16), (5, 24, 16), (3, 32, 32), (1, 32, 32))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        root = make_latent_shards(
            tmp / "latents", args.shards, args.per_shard, args.channels, shapes, (64, 512), seed=0
        )
        index = read_index(root)
        total_mb = sum(s.bytes for s in index.shards) / 1e6

        def drain(make_loader) -> tuple[int, float]:
            packer = Packer(make_loader(), (1, 2, 2), args.budget)
            started, n = time.perf_counter(), 0
            while (batch := packer.next_batch()) is not None:
                n += len(batch.keys)
            return n, time.perf_counter() - started

        n, s = drain(lambda: ShardLoader([root], epochs=1, shuffle_buffer=64))
        report(
            "local",
            samples=n,
            seconds=round(s, 3),
            samples_per_s=round(n / s, 1),
            MB_per_s=round(total_mb / s, 1),
        )

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        os.environ.update(
            AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
        )
        options = {"endpoint_url": f"http://{host}:{port}"}
        fsspec.filesystem("s3", skip_instance_cache=True, **options).mkdir("bench")
        upload(root, Remote("s3://bench/latents", options), [s.name for s in index.shards], finish=True)
        store = StoreSettings(str(tmp / "cache"), storage_options=options)
        for name in ("s3_cold_cache", "s3_warm_cache"):
            n, s = drain(
                lambda: ShardLoader(["s3://bench/latents"], epochs=1, shuffle_buffer=64, store=store)
            )
            report(
                name,
                samples=n,
                seconds=round(s, 3),
                samples_per_s=round(n / s, 1),
                MB_per_s=round(total_mb / s, 1),
            )
        server.stop()

        step_s = args.step_ms / 1000
        for depth in (0, args.prefetch):
            packer = Packer(ShardLoader([root], epochs=None, shuffle_buffer=64), (1, 2, 2), args.budget)
            source = Prefetcher(packer, depth) if depth else packer
            source.next_batch()  # the first batch waits either way: the pipeline fills
            wait = 0.0
            started = time.perf_counter()
            for _ in range(args.steps):
                t = time.perf_counter()
                source.next_batch()
                wait += time.perf_counter() - t
                time.sleep(step_s)
            elapsed = time.perf_counter() - started
            if depth:
                source.close()
            report(
                "step_data_wait",
                prefetch=depth,
                step_ms=args.step_ms,
                wait_ms_per_step=round(wait / args.steps * 1000, 2),
                wait_share=round(wait / elapsed, 4),
            )


if __name__ == "__main__":
    main()

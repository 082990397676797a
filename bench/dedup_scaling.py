"""`vidforge dedup`'s scaling curve: synthetic clip embeddings with planted near-duplicates at 10K, 100K and
1M (512-d), time and peak memory of the semantic dedup against the greedy one-run dedup
(`curate/embeddings/greedy_dedup.py`, where it finishes in --greedy-limit seconds), and recall/precision of the dropped
clips against exact all-pairs dedup (the same rule on all N^2 pairs) on a 50K set.

Data: unit vectors around 256 topics (a topic direction at 0.4 of the noise's norm, so k-means has
structure to find but clusters overlap), and --dup-fraction of the rows replaced by copies of random
other rows with per-copy noise, at cosine about 0.94-0.995 to their original (some under the 0.95
threshold). Each size runs in its own process (its peak RSS is its own), the store written first.

Usage: python bench/dedup_scaling.py [--sizes 10000,100000,1000000] [--dim 512] [--recall-n 50000]
       [--greedy-limit 300] [--probes 4] [--cluster-size 1000] [--dedup-limit 3600]
       python bench/dedup_scaling.py --pair 100000,1000000 [--repeats 2]
Prints one JSON object per measurement and a markdown table at the end.

`--pair SMALL,LARGE`: the growth between two sizes as a timing pair on one machine in one run: both
stores written first, then the dedups interleaved (torch imported before each one's clock starts) (small, large, large, small, ...: a load that drifts
during the run weighs on both sizes alike), each pair's ratio of wall and of CPU seconds (all threads: the work, where a shared machine's wall time
is also its queue) printed beside N's ratio and N log N's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODEL = {"name": "synthetic", "checkpoint": None}
CHUNK = 1 << 16


def synthetic(n: int, dim: int, dup_fraction: float, seed: int = 0):
    """Yield (ids, vectors) chunks of the synthetic set (planted copies point at rows of earlier chunks
    or their own chunk's earlier rows, so the set is generated in one pass)."""
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((256, dim), dtype=np.float32)
    topics *= 0.4
    kept: list[np.ndarray] = []  # a reservoir of earlier rows to copy from (bounded memory)
    for start in range(0, n, CHUNK):
        m = min(CHUNK, n - start)
        x = topics[rng.integers(0, 256, m)] + rng.standard_normal((m, dim), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        pool = np.concatenate([*kept, x[: m // 2]])
        copies = np.flatnonzero(rng.random(m) < dup_fraction)
        copies = copies[copies >= m // 2]  # copy only from rows already in the pool
        src = pool[rng.integers(0, len(pool), len(copies))]
        noise = rng.standard_normal((len(copies), dim), dtype=np.float32)
        noise *= rng.uniform(0.1, 0.35, (len(copies), 1)).astype(np.float32) / np.sqrt(dim)
        y = src + noise
        x[copies] = y / np.linalg.norm(y, axis=1, keepdims=True)
        kept = [x[rng.integers(0, m, min(m, 4096))]] + kept[:7]
        yield [f"s{start + i:08d}" for i in range(m)], x


def write_synthetic_store(run: Path, n: int, dim: int, dup_fraction: float) -> None:
    from vidforge.data.embeddings import EMBEDDINGS_DIR, write_index, write_shard

    folder, names = run / EMBEDDINGS_DIR, []
    for i, (ids, x) in enumerate(synthetic(n, dim, dup_fraction)):
        names.append(f"part-{i:06d}")
        write_shard(folder, names[-1], ids, x, {"duration_s": np.ones(len(ids), np.float32)})
    write_index(folder, names, MODEL, ["duration_s"])


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(kind: str, run: Path, out: Path, sets: list[str], warm: bool = False) -> dict:
    """One measurement in this process: `semantic` (vidforge dedup) or `greedy` (curate/embeddings/greedy_dedup.py).
    `warm`: torch imported before the clock starts (a fixed cost that would flatten a growth ratio)."""
    from vidforge.profile import load_profile

    if warm:
        import torch  # noqa: F401

    profile = load_profile(None, sets)
    started, cpu_started = time.perf_counter(), time.process_time()
    if kind == "semantic":
        from vidforge.curate.embeddings.semdedup import run as dedup

        summary = dedup(profile, [run], out)
        result = {
            "dropped": summary["dropped"],
            "clusters": summary["clusters"],
            "phases": summary["seconds"],
        }
    else:
        from vidforge.curate.embeddings.greedy_dedup import near_duplicates
        from vidforge.data.embeddings import EmbeddingStore

        vectors = EmbeddingStore.open(run).vectors()
        result = {"dropped": len(near_duplicates(vectors, profile.curation.semantic_dedup.threshold))}
    return {
        **result,
        "seconds": round(time.perf_counter() - started, 2),
        # CPU seconds of all its threads: on a shared machine, the work done, where wall time is the queue.
        "cpu_seconds": round(time.process_time() - cpu_started, 2),
        "peak_rss_mb": round(peak_rss_mb()),
    }


def measure(kind: str, run: Path, out: Path, sets: list[str], limit: float, warm: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--one", kind, "--run", str(run), "--out", str(out)]
    cmd += ["--warm"] if warm else []
    cmd += [x for s in sets for x in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit, check=True)
    except subprocess.TimeoutExpired:
        return {"seconds": None, "note": f"stopped at {limit:.0f} s"}
    except subprocess.CalledProcessError as err:
        return {"seconds": None, "note": err.stderr.strip().splitlines()[-1][:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def recall(n: int, dim: int, dup_fraction: float, sets: list[str], work: Path) -> dict:
    """Dropped clips of `vidforge dedup` against all-pairs on the same n rows."""
    from vidforge.curate.embeddings.semdedup import exact_duplicates, load_corpus
    from vidforge.data.embeddings import DROPPED
    from vidforge.data.manifest import read_jsonl
    from vidforge.profile import load_profile

    run = work / f"recall-{n}"
    write_synthetic_store(run, n, dim, dup_fraction)
    threshold = load_profile(None, sets).curation.semantic_dedup.threshold
    corpus = load_corpus([run])
    started = time.perf_counter()
    exact = exact_duplicates(corpus.exact(np.arange(len(corpus))), corpus.rank, threshold)
    exact_s = time.perf_counter() - started
    want = set(corpus.ids_of(np.array(sorted(exact), np.int64)).tolist())
    got = measure("semantic", run, work / f"recall-{n}-out", sets, 3600)
    found = {r["clip_id"] for r in read_jsonl(work / f"recall-{n}-out" / DROPPED)}
    hit = len(found & want)
    return {
        "n": n,
        "exact_dropped": len(want),
        "dropped": len(found),
        "recall": round(hit / max(1, len(want)), 5),
        "precision": round(hit / max(1, len(found)), 5),
        "exact_seconds": round(exact_s, 2),
        "seconds": got["seconds"],
    }


def pair(small: int, large: int, args, sets: list[str], work: Path) -> None:
    """Interleaved dedups of two sizes (ABBA order), their time ratio against N and N log N."""
    for n in (small, large):
        if not (work / f"n{n}" / "embeddings" / "index.json").is_file():
            write_synthetic_store(work / f"n{n}", n, args.dim, args.dup_fraction)
    order = [small, large, large, small] * (args.repeats // 2) + [small, large] * (args.repeats % 2)
    times: dict[int, list[float]] = {small: [], large: []}
    cpu: dict[int, list[float]] = {small: [], large: []}
    for i, n in enumerate(order):
        load = os.getloadavg()[0]
        out = work / f"n{n}-out-{i}"
        shutil.rmtree(out, ignore_errors=True)  # a dedup resumes from what it finds there
        got = measure("semantic", work / f"n{n}", out, sets, 3600, warm=True)
        times[n].append(got["seconds"])
        cpu[n].append(got["cpu_seconds"])
        print(json.dumps({"n": n, "load_1min_before": round(load, 2), **got}), flush=True)
    n_ratio = large / small
    nlogn = n_ratio * np.log(large) / np.log(small)
    print("\n| clips | dedup wall s (each run) | CPU s (each run) |\n|---|---|---|")
    for n in (small, large):
        print(
            f"| {n:,} | {', '.join(f'{t:.1f}' for t in times[n])} | {', '.join(f'{t:.1f}' for t in cpu[n])} |"
        )
    for label, got in (("wall", times), ("CPU", cpu)):
        ratios = [b / a for a, b in zip(got[small], got[large], strict=True)]
        print(
            f"{label} ratio {large:,} / {small:,}: {', '.join(f'{r:.2f}' for r in ratios)} (pairs in run "
            f"order), of the means {np.mean(got[large]) / np.mean(got[small]):.2f}"
        )
    print(f"N ratio {n_ratio:.0f}, N log N ratio {nlogn:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--dup-fraction", type=float, default=0.1)
    ap.add_argument("--recall-n", type=int, default=50000)
    ap.add_argument("--greedy-limit", type=float, default=300)
    ap.add_argument("--probes", type=int, default=None)
    ap.add_argument("--cluster-size", type=int, default=None)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--dedup-limit", type=float, default=3600, help="seconds a size's dedup may run")
    ap.add_argument("--pair", default=None, help="SMALL,LARGE: interleaved timing pair (see above)")
    ap.add_argument("--repeats", type=int, default=2, help="--pair: runs of each size")
    ap.add_argument("--one", choices=["semantic", "greedy"], help=argparse.SUPPRESS)
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--set", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, Path(args.run), Path(args.out), args.set, args.warm)))
        return
    sys.path.insert(0, str(ROOT / "src"))
    sets = []
    if args.probes is not None:
        sets.append(f"curation.semantic_dedup.probes={args.probes}")
    if args.cluster_size is not None:
        sets.append(f"curation.semantic_dedup.cluster_size={args.cluster_size}")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="vidforge-dedup-bench-"))
    rows = []
    load = os.getloadavg()[0]
    print(json.dumps({"cpus": len(os.sched_getaffinity(0)), "load_1min": round(load, 2), "sets": sets}))
    if args.pair:
        pair(*[int(s) for s in args.pair.split(",")], args, sets, work)
        return
    rec = recall(args.recall_n, args.dim, args.dup_fraction, sets, work) if args.recall_n else None
    if rec is not None:
        print(json.dumps({"recall": rec}), flush=True)
    for n in [int(s) for s in args.sizes.split(",") if s]:
        run = work / f"n{n}"
        started = time.perf_counter()
        if not (run / "embeddings" / "index.json").is_file():  # a --workdir's store of this size is reused
            write_synthetic_store(run, n, args.dim, args.dup_fraction)
        write_s = time.perf_counter() - started
        shutil.rmtree(work / f"n{n}-out", ignore_errors=True)  # a dedup resumes from what it finds there
        sem = measure("semantic", run, work / f"n{n}-out", sets, args.dedup_limit)
        greedy = measure("greedy", run, work / f"n{n}-greedy", sets, args.greedy_limit)
        row = {"n": n, "store_write_s": round(write_s, 1), "semantic": sem, "greedy": greedy}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\nload average (1 min) at start: {load:.1f}; {len(os.sched_getaffinity(0))} usable cores")
    print(
        "| clips | dedup s | k-means s | pairs s | peak RSS MB | clusters | dropped | greedy s | greedy dropped |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, g = r["semantic"], r["greedy"]
        phases = s.get("phases", {})
        print(
            f"| {r['n']:,} | {s['seconds']} | {phases.get('kmeans')} | {phases.get('pairs')} | "
            f"{s.get('peak_rss_mb')} | {s.get('clusters')} | {s.get('dropped')} | "
            f"{g['seconds'] if g['seconds'] is not None else g['note']} | {g.get('dropped', '–')} |"
        )
    if rec is not None:
        print(
            f"\nrecall on {rec['n']:,}: {rec['recall']:.4f}, precision {rec['precision']:.4f} "
            f"({rec['exact_dropped']} dropped by all-pairs in {rec['exact_seconds']} s, "
            f"dedup in {rec['seconds']} s)"
        )


if __name__ == "__main__":
    main()

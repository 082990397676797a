"""`vidforge dedup RUN... -o OUT`: semantic deduplication across runs (SemDeDup, Abbas et al. 2023, as NeMo
Curator runs it: k-means over the clip embeddings, then pairwise cosine inside each cluster).

The rule: a clip is dropped when a clip ranked above it (`curation.semantic_dedup.keep`: first seen,
highest aesthetic, longest; ties to the first seen) has cosine similarity at least `threshold` with it;
its record names the most similar such clip. The rule is a property of pairs, so the clusters are only a
way to find the pairs: `exact_duplicates` applies it to all N^2 pairs, and the clustered search equals it
where it finds every pair above the threshold (measured: bench/dedup_scaling.py, docs/benchmarks.md).

Finding the pairs in N x cluster_size work:
1. Two-level spherical k-means (torch, on CUDA when there is one; fitted on a seeded sample, every clip
   then assigned): sqrt(K) coarse cells, each split into its own fine clusters, K = N / cluster_size fine
   clusters in all. Assigning a clip costs sqrt(K) + a few cells' fine centroids, not K.
2. Each clip belongs to its nearest fine centroid and is also compared in its next `probes - 1` nearest
   (searched among the fine centroids of the coarse cells nearest its cell's clips, `coarse_probes` each):
   a duplicate pair that a cluster boundary splits lies near both centroids, so one of the two clips
   probes the other's cluster.
3. Per cluster, a unit of work: cosine of (members + probers) x members, the candidates kept. Units go
   through the curation executor (`--executor local|ray`) and commit to a unit ledger under OUT, so a
   killed run resumes by cluster; the partition is saved first (OUT/plan.npy) and reused.

Memory: the vectors stay in the stores. One pass over the stores digests the input (the resume key) and
finds rows that are not finite, the k-means reads its samples, two more passes assign every clip to a
coarse cell and find its probes, then a cluster's rows are read as its unit needs them. What is held a
clip (int32, at the default 4 probes): the rank 4 bytes throughout; in the partition the coarse cell 4,
the cells' member lists 4 during the fine k-means, the probes 16 (28 with the rank at its peak); in the
grouping the probes and the groups' row lists 16 (36); in the pairs the rank and the groups (20).
Besides, bounded whatever N is: torch (~0.5 GB), a pass's chunk of `_LOAD_ROWS` rows (32 MB at 512-d)
or a cell's k-means sample (read by position, `gather_rows`, so no shard's pages stay mapped), one
similarity block (`_SIMS_BLOCK`, `_PAIR_BLOCK`: 16 MB), the fine centroids and a cell's candidates among
them (K x D float32 each: 20 MB at 10M clips), a sort chunk (`_SORT_CHUNK`) and the clusters in flight (measured: docs/benchmarks.md).

Output: OUT/dropped.jsonl (clip_id, run, duplicate_of, duplicate_run, similarity), OUT/summary.json.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vidforge.curate.executors import make_executor
from vidforge.curate.stage import Stage, StageStats
from vidforge.data.embeddings import (
    AESTHETIC,
    DROPPED,
    DURATION,
    EmbeddingStore,
    NpyHeader,
    gather_rows,
    read_rows,
)
from vidforge.data.manifest import atomic_path, stable_id, write_json, write_jsonl
from vidforge.data.units import UNITS_DIR, UnitLedger
from vidforge.device import select_device
from vidforge.errors import UserInputError

PLAN = "plan.npy"
PLAN_KEY = "plan.json"
SUMMARY = "summary.json"
KEEP_COLUMNS = {"aesthetic": AESTHETIC, "longest": DURATION}
_WHO_WRITES = {
    AESTHETIC: "dedup the output of `vidforge caption` run on it with curation.caption.aesthetic.enabled=true",
    DURATION: "rerun `vidforge clip` on it to rewrite its store",
}
_SIMS_BLOCK = 1 << 22  # similarities per matmul when assigning clips to centroids (16 MB of float32):
# a cell's clips are matched against the fine centroids of every cell near them, up to all K of them
# (10K at 10M clips), and 32K rows x 10K centroids was a 1.3 GB block
_SORT_CHUNK = 1 << 18  # entries sorted at a time by `_rows_by_key` (its temporaries ~70 bytes an entry)


@dataclass
class Corpus:
    """Every clip of the runs, in order: run by run, each in its store's (manifest) order. The vectors stay
    in the stores: they are read a chunk or a cluster at a time (`chunks`, `exact`), so memory holds a few
    integers a clip, not its vector (1M x 512 float32 is 2 GB, 10M is 20 GB)."""

    runs: list[Path]
    run_starts: np.ndarray
    """The first row of each run, then the number of rows."""
    rank: np.ndarray
    """0 for the clip kept first: where two clips are duplicates, the lower rank stays (int32: 10M clips in
    40 MB)."""
    model: dict[str, Any]
    dim: int
    files: list[Path]
    """The vectors file of every shard, in row order."""
    headers: list[NpyHeader]
    """The header of each of `files`, read when its store was opened: a gather does not parse it again."""
    id_files: list[Path]
    """The ids file of every shard, in row order: ids are read where a record names a clip (a dropped one,
    its duplicate), not held (10M ids as U16 are 640 MB)."""
    starts: np.ndarray
    """The first row of each of `files`, then the number of rows."""
    not_finite: np.ndarray
    """Rows whose stored vector holds a NaN or an infinity: compared with nothing, so never dropped."""
    digest: str
    """sha256 of what the result depends on: the ids, the stored vectors' bytes, the keep scores."""

    def __len__(self) -> int:
        return int(self.starts[-1])

    def ids_of(self, rows: np.ndarray) -> np.ndarray:
        """The clip ids of `rows` (any order), from the stores' id files."""
        rows = np.asarray(rows, np.int64)
        part = np.searchsorted(self.starts, rows, side="right") - 1
        out = np.empty(len(rows), object)
        for p in np.unique(part):
            at = np.flatnonzero(part == p)
            out[at] = np.load(self.id_files[p], mmap_mode="r")[rows[at] - self.starts[p]]
        return out.astype(str) if len(out) else np.zeros(0, str)

    def run_of(self, rows: np.ndarray) -> np.ndarray:
        """The index in `runs` of each of `rows`."""
        return np.searchsorted(self.run_starts, np.asarray(rows), side="right") - 1

    def exact(self, rows: np.ndarray) -> np.ndarray:
        """float32 unit vectors of `rows` (any order), from the stores: each row read where it lies
        (`gather_rows`), so neither the pages read nor a read-ahead around them stay in this process."""
        rows = np.asarray(rows, np.int64)
        out = np.zeros((len(rows), self.dim), np.float32)
        part = np.searchsorted(self.starts, rows, side="right") - 1
        for p in np.unique(part):
            at = np.flatnonzero(part == p)
            out[at] = gather_rows(self.files[p], rows[at] - self.starts[p], self.headers[p])
        return _unit_rows(out)

    def chunks(self) -> Iterator[np.ndarray]:
        """All rows in order as float32 unit vectors, a few thousand at a time."""
        for raw in _raw_chunks(self.files, self.starts):
            yield _unit_rows(raw)


def _unit_rows(x: np.ndarray) -> np.ndarray:
    """`x` (float32) with each row scaled to unit length in place; a row that is not finite becomes zero."""
    x[~np.isfinite(x).all(axis=1)] = 0
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))[:, None]  # no (N, D) temporary, as norm makes
    np.divide(x, norms, out=x, where=norms > 0)
    return x


_LOAD_ROWS = 1 << 14  # rows read at a time in a pass over the stores (32 MB at 512-d)


def _raw_chunks(files: Sequence[Path], starts: np.ndarray) -> Iterator[np.ndarray]:
    for path, first, end in zip(files, starts[:-1], starts[1:], strict=True):
        for c in range(0, int(end - first), _LOAD_ROWS):
            yield np.asarray(read_rows(path, c, min(c + _LOAD_ROWS, int(end - first))), np.float32)


def load_corpus(runs: Sequence[str | os.PathLike], keep: str = "first") -> Corpus:
    """The runs' clips: ids, the keep rule's ranking, and one pass over their vectors for the input's
    digest and the rows that are not finite (the vectors themselves are not kept)."""
    stores = [EmbeddingStore.open(r) for r in runs]
    if not stores:
        raise UserInputError("give at least one RUN (a `vidforge clip` output with embeddings)")
    first = stores[0]
    for s in stores[1:]:
        if (s.model.get("name"), s.model.get("checkpoint"), s.dim) != (
            first.model.get("name"),
            first.model.get("checkpoint"),
            first.dim,
        ):
            raise UserInputError(
                f"{s.run_dir}: embedded by {s.model.get('name')} ({s.dim}-d), {first.run_dir} by "
                f"{first.model.get('name')} ({first.dim}-d); dedup runs embedded by the same model"
            )
    digest = hashlib.sha256(json.dumps([s.model for s in stores]).encode())
    scores, files, headers, id_files, sizes = [], [], [], [], []
    for s in stores:
        files += [s.folder / f"{sh['name']}.vectors.npy" for sh in s.index["shards"]]
        headers += [s.header(sh["name"]) for sh in s.index["shards"]]
        id_files += [s.folder / f"{sh['name']}.ids.npy" for sh in s.index["shards"]]
        sizes += [sh["rows"] for sh in s.index["shards"]]
        for sh in s.index["shards"]:  # a shard at a time: the digest's bytes as before, not all ids held
            digest.update(np.ascontiguousarray(np.load(s.folder / f"{sh['name']}.ids.npy")).tobytes())
        if keep != "first":
            if not s.has_column(KEEP_COLUMNS[keep]):
                raise UserInputError(
                    f"{s.run_dir}: its embeddings have no `{KEEP_COLUMNS[keep]}` column for "
                    f"curation.semantic_dedup.keep={keep}; {_WHO_WRITES[KEEP_COLUMNS[keep]]}, or use keep=first"
                )
            scores.append(s.column(KEEP_COLUMNS[keep]))
            digest.update(scores[-1].tobytes())
    starts = np.cumsum([0, *sizes]).astype(np.int64)
    bad, row = [], 0
    for raw in _raw_chunks(files, starts):
        digest.update(raw.tobytes())
        bad.append(row + np.flatnonzero(~np.isfinite(raw).all(axis=1)))
        row += len(raw)
    n = int(starts[-1])
    rank = np.arange(n, dtype=np.int32)
    if keep != "first":  # higher score first, then first seen; NaN (not measured) below every score
        order = np.lexsort((rank, -np.concatenate(scores)))
        rank[order] = np.arange(n, dtype=np.int32)
    return Corpus(
        runs=[s.run_dir for s in stores],
        run_starts=np.cumsum([0, *(s.rows for s in stores)]).astype(np.int64),
        rank=rank,
        model=first.model,
        dim=first.dim or 0,
        files=files,
        headers=headers,
        id_files=id_files,
        starts=starts,
        not_finite=np.concatenate(bad) if bad else np.zeros(0, np.int64),
        digest=digest.hexdigest(),
    )


# -- the rule on all pairs -------------------------------------------------------------------------------


def exact_duplicates(
    vectors: np.ndarray, rank: np.ndarray, threshold: float, chunk: int = 2048
) -> dict[int, tuple[int, float]]:
    """{dropped row: (row it duplicates, cosine)} over all N^2 pairs: the reference the clustered search
    is measured against (and fine for a few tens of thousands of clips)."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(vectors, np.float32))
    r = torch.from_numpy(rank)
    out: dict[int, tuple[int, float]] = {}
    for s in range(0, len(x), chunk):
        sims = x[s : s + chunk] @ x.T
        better = r[None, :] < r[s : s + chunk, None]
        sims = torch.where(better & (sims >= threshold), sims, torch.tensor(-math.inf))
        best, arg = _best(sims, r, dim=1)
        for i in torch.nonzero(best > -math.inf).flatten().tolist():
            out[s + i] = (int(arg[i]), float(best[i]))
    return out


def _best(sims, rank, dim: int):
    """Max along `dim`, ties to the lowest rank (so the record does not depend on the row order)."""
    import torch

    best = sims.max(dim=dim).values
    at_best = sims == best.unsqueeze(dim)
    ranks = torch.where(at_best, rank.unsqueeze(1 - dim).expand_as(sims), torch.iinfo(rank.dtype).max)
    return best, ranks.argmin(dim=dim)


# -- the partition ---------------------------------------------------------------------------------------


def _nearest(x, centroids, top: int):
    """Indices of each row's `top` most similar centroids (rows and centroids unit vectors)."""
    import torch

    top = min(top, len(centroids))
    out = torch.empty((len(x), top), dtype=torch.int64, device=x.device)
    step = max(64, _SIMS_BLOCK // max(1, len(centroids)))
    for s in range(0, len(x), step):
        out[s : s + step] = (x[s : s + step] @ centroids.T).topk(top, dim=1).indices
    return out


def _sample(n: int, size: int, gen):
    import torch

    if n <= size:
        return torch.arange(n)
    return torch.randperm(n, generator=gen)[:size].sort().values


def spherical_kmeans(x, k: int, iterations: int, gen):
    """(k, D) unit centroids of unit rows `x` (cosine k-means, Lloyd's iterations from a seeded sample of
    rows). An emptied cluster keeps its centroid."""
    import torch

    k = max(1, min(k, len(x)))
    centroids = x[torch.randperm(len(x), generator=gen)[:k]].clone()
    for _ in range(iterations):
        assign = _nearest(x, centroids, 1)[:, 0]
        # A one-hot matmul: CPU index_add_ measured ~1000x slower here, and this costs what assigning did.
        onehot = torch.zeros(k, len(x), device=x.device)
        onehot[assign, torch.arange(len(x), device=x.device)] = 1.0
        sums = onehot @ x
        empty = torch.bincount(assign, minlength=k) == 0
        sums[empty] = centroids[empty]
        centroids = torch.nn.functional.normalize(sums, dim=1)
    return centroids


def partition(corpus: Corpus, cfg) -> np.ndarray:
    """(N, probes) cluster ids per clip, nearest first (column 0: the cluster it belongs to); -1 pads a
    row with fewer candidate clusters than probes, and is every cluster of a row that is not finite
    (compared with nothing). `cfg` is `curation.semantic_dedup`. The vectors are read from the stores as
    they are needed: the k-means samples, one pass assigning every clip to a coarse cell, one more
    finding its probes (`_probes`; a chunk of rows in hand, whatever N is).

    Held a clip while it runs (int32): its coarse cell 4 bytes, the cells' member lists 4 (during the
    fine k-means), the probes 4 x probes; the first pass keeps of each clip's `coarse_probes` nearest
    cells only which cells its cell's clips reach (a cells x cells table)."""
    import torch

    device = select_device(cfg.device, "curation.semantic_dedup.device")
    n = len(corpus)
    if n == 0:
        return np.zeros((0, cfg.probes), np.int32)

    def rows_of(rows) -> torch.Tensor:
        return torch.from_numpy(corpus.exact(np.asarray(rows))).to(device)

    gen = torch.Generator().manual_seed(cfg.seed)
    k = max(1, math.ceil(n / cfg.cluster_size))
    k1 = max(1, round(math.sqrt(k)))
    coarse = spherical_kmeans(rows_of(_sample(n, cfg.sample_per_cluster * k1, gen)), k1, cfg.iterations, gen)
    cell = np.empty(n, np.int32)
    # reach[c, d]: a clip of cell c has cell d among its nearest `coarse_probes` (k1 x k1, not N x probes)
    reach = np.zeros((len(coarse), len(coarse)), bool)
    row = 0
    for x in corpus.chunks():
        near = _nearest(torch.from_numpy(x).to(device), coarse, cfg.coarse_probes).cpu().numpy()
        cell[row : row + len(near)] = near[:, 0]
        reach[near[:, :1], near] = True
        row += len(near)
    members, bounds = _rows_by_key(cell[:, None], len(coarse))  # each cell's clips in row order
    fine, first_of = [], [0]
    for c in range(len(coarse)):
        rows = members[bounds[c] : bounds[c + 1]]
        kc = max(1, round(len(rows) / cfg.cluster_size)) if len(rows) else 0
        if kc:
            sub = rows[_sample(len(rows), cfg.sample_per_cluster * kc, gen).numpy()]
            fine.append(spherical_kmeans(rows_of(sub), kc, cfg.iterations, gen))
        first_of.append(first_of[-1] + (len(fine[-1]) if kc else 0))
    del members, bounds
    centroids = torch.cat(fine)
    return _probes(corpus, cell, reach, centroids, first_of, cfg.probes, device)


def _probes(
    corpus: Corpus, cell: np.ndarray, reach: np.ndarray, centroids, first_of: list[int], top: int, device
):
    """(N, top) nearest fine centroids of every clip among those of the coarse cells its cell's clips reach
    (chosen by the cell's centroids alone, a clip near a far side of its cell missed its twin's cluster).

    One pass over the stores in row order, a chunk's clips grouped by cell: gathering a cell's clips
    instead read every clip at random, at 10M (a 20 GB store, larger than the page cache) 290 GB of
    mapped pages' read-around in the partition's first hour, and by position still a disk round trip a
    row."""
    import torch

    candidates: dict[int, torch.Tensor] = {}  # a cell's fine centroids, as ids into `centroids`

    def candidates_of(c: int) -> torch.Tensor:
        if c not in candidates:
            candidates[c] = torch.cat(
                [torch.arange(first_of[d], first_of[d + 1], device=device) for d in np.flatnonzero(reach[c])]
            )
        return candidates[c]

    probes = np.full((len(cell), top), -1, np.int32)
    row = 0
    for x in corpus.chunks():
        here = cell[row : row + len(x)]
        for c in np.unique(here).tolist():
            at = np.flatnonzero(here == c)
            ids = candidates_of(c)
            # a cell whose clips reach every cell (random vectors' cells do) needs no copy
            among = centroids if len(ids) == len(centroids) else centroids[ids]
            picked = _nearest(torch.from_numpy(x[at]).to(device), among, top)
            probes[row + at, : picked.shape[1]] = ids[picked].cpu().numpy()
        row += len(x)
    probes[corpus.not_finite] = -1
    return probes


def _rows_by_key(keys: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows of `keys` (N, c) int, grouped by key: key j's rows are `rows[bounds[j] : bounds[j + 1]]`,
    in row order (a row once for each of its columns holding j); keys of -1 are left out. What a stable
    argsort of `keys.ravel()` gives, but a counting sort a chunk at a time: int32 rows and chunk-sized
    temporaries, not the argsort's int64 order and its buffer (N x c x 12 bytes)."""
    n, c = keys.shape
    step = max(1, _SORT_CHUNK // max(1, c))
    counts = np.zeros(n_keys, np.int64)
    for s in range(0, n, step):
        k = keys[s : s + step].ravel()
        counts += np.bincount(k[k >= 0], minlength=n_keys)
    bounds = np.zeros(n_keys + 1, np.int64)
    np.cumsum(counts, out=bounds[1:])
    rows = np.empty(int(bounds[-1]), np.int32)
    cursor = bounds[:-1].copy()  # where each key's next row goes
    for s in range(0, n, step):
        k = keys[s : s + step].ravel()
        at = np.flatnonzero(k >= 0)
        order = np.argsort(k[at], kind="stable")
        sorted_keys = k[at][order]
        here = np.bincount(sorted_keys, minlength=n_keys)
        first = np.cumsum(here) - here  # where each key starts in this chunk's sorted keys
        rows[cursor[sorted_keys] + np.arange(len(order)) - first[sorted_keys]] = s + at[order] // max(1, c)
        cursor += here
    return rows, bounds


# -- the work per cluster --------------------------------------------------------------------------------


@dataclass
class ClusterWork:
    """One cluster's comparison: `rows` (global) are its members then its probers; `vectors` and `ranks`
    are theirs. After the stage: `found`, (dropped row, duplicate row, cosine) candidates."""

    cluster: int
    rows: np.ndarray
    members: int
    vectors: np.ndarray | None
    ranks: np.ndarray
    found: list[tuple[int, int, float]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"cluster {self.cluster}"


_PAIR_BLOCK = 1 << 22  # similarities per block (16 MB of float32): k-means clusters are uneven, a big one
# compared 4096 rows at a time held several (4096, members) temporaries of hundreds of MB


def cluster_pairs(
    work: ClusterWork, threshold: float, chunk: int = 4096, device: str = "cpu"
) -> list[tuple[int, int, float]]:
    """Candidates within one cluster: each row (member or prober) against the members ranked above it,
    and each member against the probers ranked above it (a prober is no column, so the pair is seen once).
    Rows go `chunk` at a time, fewer where the cluster has many members (`_PAIR_BLOCK`)."""
    import torch

    x = torch.from_numpy(work.vectors).to(device)
    rank = torch.from_numpy(work.ranks).to(device)
    m = work.members
    chunk = max(64, min(chunk, _PAIR_BLOCK // max(1, m)))
    cols, col_rank = x[:m], rank[:m]
    found = []
    minus_inf = torch.tensor(-math.inf, device=device)
    col_best = torch.full((m,), -math.inf, device=device)
    col_arg = torch.zeros(m, dtype=torch.int64, device=device)
    for s in range(0, len(x), chunk):
        sims = x[s : s + chunk] @ cols.T
        row_rank = rank[s : s + chunk]
        near = sims >= threshold
        above = torch.where(near & (col_rank[None, :] < row_rank[:, None]), sims, minus_inf)
        best, arg = _best(above, col_rank, dim=1)
        for i in torch.nonzero(best > -math.inf).flatten().tolist():
            found.append((int(work.rows[s + i]), int(work.rows[int(arg[i])]), float(best[i])))
        lo = max(s, m)  # probers in this chunk: rows from m on
        if lo < s + len(sims):
            probe_sims = torch.where(
                near[lo - s :] & (row_rank[lo - s :, None] < col_rank[None, :]), sims[lo - s :], minus_inf
            )
            best, arg = _best(probe_sims.T, row_rank[lo - s :], dim=1)
            better = best > col_best  # earlier chunks win ties: their rows come first
            col_best = torch.where(better, best, col_best)
            col_arg = torch.where(better, arg + lo, col_arg)
    for j in torch.nonzero(col_best > -math.inf).flatten().tolist():
        found.append((int(work.rows[j]), int(work.rows[int(col_arg[j])]), float(col_best[j])))
    return found


class PairStage(Stage[ClusterWork, ClusterWork]):
    """ClusterWork -> ClusterWork with its candidates (torch matmuls; a thread, one per driver)."""

    name = "pairs"
    kind = "thread"
    workers = 1
    resources = {"num_cpus": 1}  # noqa: RUF012

    def __init__(self, threshold: float, device: str = "auto"):
        self.threshold, self.device = threshold, device

    def setup(self) -> None:
        self.device = str(select_device(self.device, "curation.semantic_dedup.device"))

    def process(self, item: ClusterWork) -> ClusterWork:
        item.found = cluster_pairs(item, self.threshold, device=self.device)
        item.vectors = None  # the driver needs only the candidates back
        return item


@dataclass
class Groups:
    """Every cluster with members, as row lists: cluster `clusters[i]`'s rows are its members (by row) then
    its probers (by row), `members[i]` of them members. Held as two sorted int32 row arrays and bounds (4
    bytes a clip and 4 a probe), each cluster's list made when its work is gathered."""

    clusters: np.ndarray
    member_rows: np.ndarray
    member_span: np.ndarray
    """(clusters, 2): where each cluster's members lie in `member_rows`."""
    prober_rows: np.ndarray
    prober_span: np.ndarray

    def __len__(self) -> int:
        return len(self.clusters)

    @property
    def members(self) -> np.ndarray:
        return self.member_span[:, 1] - self.member_span[:, 0]

    @property
    def sizes(self) -> np.ndarray:
        """Rows compared in each cluster (members and probers)."""
        return self.members + self.prober_span[:, 1] - self.prober_span[:, 0]

    def rows(self, i: int) -> np.ndarray:
        (m0, m1), (p0, p1) = self.member_span[i], self.prober_span[i]
        return np.concatenate([self.member_rows[m0:m1], self.prober_rows[p0:p1]])


def _groups(probes: np.ndarray) -> Groups:
    """The clusters of `probes` (N, probes) with their members and probers, each in row order: column 0
    grouped by cluster id for the members, the rest for the probers (`_rows_by_key`)."""
    n_clusters = int(probes.max()) + 1 if probes.size else 0
    member_rows, member_at = _rows_by_key(probes[:, :1], n_clusters)
    prober_rows, prober_at = _rows_by_key(probes[:, 1:], n_clusters)
    clusters = np.flatnonzero(member_at[1:] > member_at[:-1]).astype(np.int32)  # a probed cluster without
    # members is no unit

    def span(at: np.ndarray) -> np.ndarray:
        return np.stack([at[clusters], at[clusters + 1]], 1)

    return Groups(clusters, member_rows, span(member_at), prober_rows, span(prober_at))


# -- the command -----------------------------------------------------------------------------------------


def _unit(cluster: int) -> str:
    return f"cluster-{cluster:07d}"


def _fingerprint(corpus: Corpus, cfg) -> str:
    """What a saved partition and committed clusters were made from: the runs, the digest of their
    contents (ids, vectors, keep scores: a store rewritten in place under the same index is another
    input) and the settings."""
    return stable_id([str(r.resolve()) for r in corpus.runs], corpus.digest, cfg.model_dump_json())


def _load_or_plan(out: Path, corpus: Corpus, cfg, ledger: UnitLedger) -> tuple[np.ndarray, bool]:
    """The saved partition when it was made for this input and these settings, else a new one (and the
    old units cleared). Returns (probes, reused)."""
    key = _fingerprint(corpus, cfg)
    saved = out / PLAN_KEY
    if saved.is_file() and json.loads(saved.read_text()).get("key") == key and (out / PLAN).is_file():
        return np.load(out / PLAN), True
    for path in (out / UNITS_DIR).glob("*.jsonl"):
        path.unlink()  # units of another input or other settings
    probes = partition(corpus, cfg)
    with atomic_path(out / PLAN) as tmp, open(tmp, "wb") as f:
        np.save(f, probes)
    write_json(saved, {"key": key, "clips": len(corpus), "probes": cfg.probes})
    return probes, False


def run(
    profile,
    runs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    executor: str = "local",
    ray_address: str | None = None,
    monitor: Callable[[list[StageStats]], None] | None = None,
    on_start: Callable[[dict[str, Any]], None] | None = None,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Deduplicate the clips of `runs` into `out`; returns the summary. `stop_after`: commit at most this
    many clusters and return without the output files (what a killed run leaves: a test of resuming)."""
    cfg = profile.curation.semantic_dedup
    out = Path(out)
    for r in runs:
        if Path(r).resolve() == out.resolve():
            raise UserInputError(f"-o {out}: must differ from every RUN")
    started = time.perf_counter()
    seconds: dict[str, float] = {}
    corpus = load_corpus(runs, cfg.keep)
    seconds["load"] = time.perf_counter() - started
    ledger = UnitLedger(out)
    ledger.recover()
    try:
        t = time.perf_counter()
        probes, reused = _load_or_plan(out, corpus, cfg, ledger)
        seconds["kmeans"] = time.perf_counter() - t
        groups = _groups(probes)
        del probes  # the groups hold what the pairs need
        todo = [i for i, c in enumerate(groups.clusters.tolist()) if not ledger.is_done(_unit(c))]
        if stop_after is not None:
            todo = todo[:stop_after]
        if on_start is not None:
            on_start(
                {"clips": len(corpus), "clusters": len(groups), "todo": len(todo), "plan_reused": reused}
            )

        def units() -> Iterator[tuple[str, ClusterWork]]:
            for i in todo:  # gathered lazily: the executor's backpressure bounds memory
                rows, cluster = groups.rows(i), int(groups.clusters[i])
                members = int(groups.members[i])
                ranks = corpus.rank[rows].astype(np.int64)
                yield _unit(cluster), ClusterWork(cluster, rows, members, corpus.exact(rows), ranks)

        def commit(unit: str, items: list[ClusterWork], errors: list[dict[str, Any]]) -> None:
            found = [f for item in items for f in item.found]
            record = {
                "dropped": [f[0] for f in found],
                "dups": [f[1] for f in found],
                "sims": [f[2] for f in found],
            }
            ledger.commit(unit, [record], errors, retry=bool(errors))

        t = time.perf_counter()
        if todo:
            options: dict[str, Any] = {"address": ray_address} if executor == "ray" else {}
            stage = PairStage(cfg.threshold, cfg.device)
            make_executor(executor, **options).run([stage], units(), commit, monitor)
        seconds["pairs"] = time.perf_counter() - t
        if stop_after is not None:
            return {"clusters": len(groups), "committed": len(todo)}
        t = time.perf_counter()
        dropped, errors = _merge(ledger, corpus)
        _write(out, corpus, dropped)
        seconds["merge"] = time.perf_counter() - t
    finally:
        ledger.release()
    summary = {
        "runs": [str(r) for r in corpus.runs],
        "clips": len(corpus),
        "dropped": len(dropped),
        "kept": len(corpus) - len(dropped),
        "clusters": len(groups),
        "pairs_compared": int(np.sum(groups.sizes.astype(np.int64) * groups.members)),
        "threshold": cfg.threshold,
        "keep": cfg.keep,
        "probes": cfg.probes,
        "seed": cfg.seed,
        "errors": errors,
        # Clips whose stored vector is not finite: compared with nothing (kept), named so that it is seen.
        "not_finite": len(corpus.not_finite),
        "not_finite_ids": corpus.ids_of(corpus.not_finite[:10]).tolist(),
        "plan_reused": reused,
        "seconds": {k: round(v, 3) for k, v in seconds.items()}
        | {"total": round(time.perf_counter() - started, 3)},
    }
    write_json(out / SUMMARY, summary)
    return summary


def _merge(ledger: UnitLedger, corpus: Corpus) -> tuple[dict[int, tuple[int, float]], int]:
    """Every cluster's candidates to {dropped row: (duplicate row, cosine)}: the most similar clip ranked
    above it, ties to the higher ranked."""
    rows, dups, sims, errors = [], [], [], 0
    for entry in ledger.entries():
        if entry["kind"] == "error":
            errors += 1
        elif entry["kind"] == "record":
            rows += entry["data"]["dropped"]
            dups += entry["data"]["dups"]
            sims += entry["data"]["sims"]
    if not rows:
        return {}, errors
    rows_, dups_, sims_ = np.asarray(rows), np.asarray(dups), np.asarray(sims)
    order = np.lexsort((corpus.rank[dups_], -sims_, rows_))
    rows_, dups_, sims_ = rows_[order], dups_[order], sims_[order]
    first = np.r_[True, rows_[1:] != rows_[:-1]]
    return {
        int(r): (int(d), float(s)) for r, d, s in zip(rows_[first], dups_[first], sims_[first], strict=True)
    }, errors


def _write(out: Path, corpus: Corpus, dropped: dict[int, tuple[int, float]]) -> None:
    rows = np.array(sorted(dropped), np.int64)
    dups = np.array([dropped[r][0] for r in rows.tolist()], np.int64)
    ids, dup_ids = corpus.ids_of(rows), corpus.ids_of(dups)
    runs, dup_runs = corpus.run_of(rows), corpus.run_of(dups)
    write_jsonl(
        out / DROPPED,
        (
            {
                "clip_id": str(ids[i]),
                "run": str(corpus.runs[runs[i]]),
                "duplicate_of": str(dup_ids[i]),
                "duplicate_run": str(corpus.runs[dup_runs[i]]),
                "similarity": round(dropped[row][1], 6),
            }
            for i, row in enumerate(rows.tolist())
        ),
    )

"""Pass 1 of the out-of-core engine: regroup a time-ordered trace by block, on disk.

An access time interval joins two accesses of the same block, which may be far apart in time (a parameter
is touched once per iteration), so time pieces alone cannot produce the intervals. Pass 1 reads the
accesses and blocks tables a row-group batch at a time (each batch one task) and splits every batch by a hash
of ``block_id`` into *buckets*, written as pieces to the scratch directory. A bucket then holds every access
of its blocks, in the original order (its pieces are concatenated in batch order), and is small: the
bucket count is chosen so a bucket has about `rows_per_bucket` accesses whatever the trace's length.
Each bucket is an ordinary little `Trace` that the in-memory analyses (`memlens.analysis.ati`,
`memlens.analysis.outliers`) run on unchanged, which is why the engines agree by construction.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from memlens.trace import Trace, conform

ACCESS_DTYPE = np.dtype([("block_id", "<i8"), ("t_ns", "<i8"), ("op_id", "<i8"), ("is_write", "?")])
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def bucket_of(block_ids: np.ndarray, n_buckets: int) -> np.ndarray:
    """Bucket of each block id: a multiplicative hash, so regular id patterns still spread evenly."""
    h = np.asarray(block_ids, dtype=np.int64).view(np.uint64) * _GOLDEN
    return ((h >> np.uint64(32)) % np.uint64(n_buckets)).astype(np.int64)


BATCH_ROWS = 1 << 20  # accesses read at once inside a task (a row group may be larger)
BLOCK_BATCH_ROWS = 1 << 18  # blocks rows are wider (strings): read fewer at once
ATI_BLOCK_COLUMNS = ("block_id", "device", "size", "alloc_ns", "free_ns")
OUTLIER_BLOCK_COLUMNS = ATI_BLOCK_COLUMNS + ("source", "category", "op", "module", "stack_id")


def _access_piece(scratch: Path, bucket: int, part: int, sub: int) -> Path:
    return scratch / f"acc-{bucket:05d}-{part:06d}-{sub:05d}.npy"


def _block_piece(scratch: Path, bucket: int, part: int, sub: int) -> Path:
    return scratch / f"blk-{bucket:05d}-{part:06d}-{sub:05d}.parquet"


def pieces(scratch, prefix: str, bucket: int) -> list[Path]:
    """A bucket's pieces in the trace's order (zero-padded names sort as the batches came)."""
    return sorted(Path(scratch).glob(f"{prefix}-{bucket:05d}-*"))


def split_accesses(files, row_groups: list[int], part: int, n_buckets: int, scratch: str) -> np.ndarray:
    """Task: split some row groups of ``accesses`` into bucket pieces, each with the ops (op_id, start_ns,
    end_ns) its accesses name; returns rows per bucket."""
    counts = np.zeros(n_buckets, dtype=np.int64)
    for sub, df in enumerate(files.iter_batches("accesses", row_groups, BATCH_ROWS, list(ACCESS_DTYPE.names))):
        rec = np.empty(len(df), dtype=ACCESS_DTYPE)
        for name in ACCESS_DTYPE.names:
            rec[name] = df[name].to_numpy(dtype=ACCESS_DTYPE[name])
        del df
        ops = _ops_for(files, rec["op_id"])
        if ops is not None:
            ops = ops[np.argsort(ops["op_id"], kind="stable")]

        def write(b, piece, sub=sub, ops=ops):
            np.save(_access_piece(Path(scratch), b, part, sub), piece)
            if ops is not None:
                np.save(Path(scratch) / f"ops-{b:05d}-{part:06d}-{sub:05d}.npy",
                        ops[_rows_with_ids(ops["op_id"], np.unique(piece["op_id"]))])
        counts += _write_split(rec, rec["block_id"], n_buckets, write)
    return counts


def _rows_with_ids(sorted_ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Positions of every row of the sorted `sorted_ids` whose id is in `wanted` (duplicates included)."""
    left = np.searchsorted(sorted_ids, wanted, side="left")
    counts = np.searchsorted(sorted_ids, wanted, side="right") - left
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    return np.repeat(left, counts) + (np.arange(total) - np.repeat(starts, counts))


OP_DTYPE = np.dtype([("op_id", "<i8"), ("start_ns", "<i8"), ("end_ns", "<i8")])


def _ops_for(files, op_ids: np.ndarray) -> np.ndarray | None:
    """The ops rows (`OP_DTYPE`) whose op_id is among `op_ids`: only the ops row groups whose op_id range
    (Parquet statistics) meets [min, max] of `op_ids` are read, so a time-ordered batch of accesses reads
    about one row group of ops, and pass 1 reads the ops table about once in all (not once per bucket).
    None when the trace has no ops table."""
    import pyarrow.parquet as pq
    if "ops" not in getattr(files, "files", {}) or files.rows.get("ops", 0) == 0 or len(op_ids) == 0:
        return None
    lo, hi = int(op_ids.min()), int(op_ids.max())
    pf = pq.ParquetFile(files.files["ops"])
    idx = pf.schema_arrow.get_field_index("op_id")
    groups = []
    for g in range(pf.metadata.num_row_groups):
        st = pf.metadata.row_group(g).column(idx).statistics
        if st is None or not st.has_min_max or (int(st.min) <= hi and int(st.max) >= lo):
            groups.append(g)
    wanted = np.unique(op_ids)
    found = []
    for g in groups:
        part = files.read("ops", [g], columns=["op_id", "start_ns", "end_ns"])
        ids = part["op_id"].to_numpy(np.int64)
        keep = np.isin(ids, wanted)
        if keep.any():
            rows = np.empty(int(keep.sum()), dtype=OP_DTYPE)
            rows["op_id"] = ids[keep]
            rows["start_ns"] = part["start_ns"].to_numpy(np.int64)[keep]
            rows["end_ns"] = part["end_ns"].to_numpy(np.int64)[keep]
            found.append(rows)
    return np.concatenate(found) if found else np.empty(0, dtype=OP_DTYPE)


def split_blocks(files, row_groups: list[int], part: int, n_buckets: int, scratch: str,
                 columns=ATI_BLOCK_COLUMNS) -> np.ndarray:
    """Task: split the `columns` of some row groups of ``blocks`` into bucket pieces (the other columns get
    their schema defaults when a bucket is loaded); returns rows per bucket."""
    counts = np.zeros(n_buckets, dtype=np.int64)
    present = [c for c in columns if c in files.columns("blocks")]
    for sub, df in enumerate(files.iter_batches("blocks", row_groups, BLOCK_BATCH_ROWS, present)):
        counts += _write_split(
            df, df["block_id"].to_numpy(dtype=np.int64), n_buckets,
            lambda b, piece: piece.to_parquet(_block_piece(Path(scratch), b, part, sub), index=False))
    return counts


def add_block_facts(out: dict, df: pd.DataFrame) -> None:
    """Accumulate the block-level counts `Trace.summary` reports from one batch of blocks."""
    out["devices"].update(df["device"].astype(str).unique().tolist())
    out["allocated_before"] += int(df["allocated_before"].sum())
    out["free_without_alloc"] += int(df["free_without_alloc"].sum())
    out["alive_at_end"] += int(df["free_ns"].isna().sum())


def _write_split(rows, block_ids: np.ndarray, n_buckets: int, write) -> np.ndarray:
    bucket = bucket_of(block_ids, n_buckets)
    order = np.argsort(bucket, kind="stable")  # stable: each piece keeps the recorded order
    counts = np.bincount(bucket, minlength=n_buckets).astype(np.int64)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    for b in np.flatnonzero(counts):
        idx = order[bounds[b]:bounds[b + 1]]
        write(int(b), rows.iloc[idx].reset_index(drop=True) if isinstance(rows, pd.DataFrame) else rows[idx])
    return counts


class _BucketTrace(Trace):
    """A bucket as a Trace: its blocks and all their accesses, with the whole trace's time span (blocks
    alive at the start or end are bounded by the trace's span, not the bucket's) and the whole trace's
    has-accesses fact."""

    _span: tuple[int, int] = (0, 0)
    _has_accesses: bool = False

    def time_span_ns(self) -> tuple[int, int]:
        return self._span

    @property
    def has_accesses(self) -> bool:
        return self._has_accesses


def load_bucket(files, scratch: str, bucket: int, span: tuple[int, int], has_accesses: bool) -> Trace:
    """The Trace of one bucket, read back from its pieces in batch order."""
    blocks = [pd.read_parquet(p) for p in pieces(scratch, "blk", bucket)]
    acc = [np.load(p) for p in pieces(scratch, "acc", bucket)]
    rec = np.concatenate(acc) if acc else np.empty(0, dtype=ACCESS_DTYPE)
    accesses = pd.DataFrame({name: rec[name] for name in ACCESS_DTYPE.names}, copy=False)
    blocks_df = pd.concat(blocks, ignore_index=True) if blocks else conform("blocks", None)
    trace = _BucketTrace(blocks=conform("blocks", blocks_df), accesses=accesses,
                         ops=conform("ops", _ops_of(scratch, bucket) if len(accesses) else None),
                         metadata=dict(files.metadata))
    trace._span = (int(span[0]), int(span[1]))
    trace._has_accesses = has_accesses
    return trace


def _ops_of(scratch: str, bucket: int) -> pd.DataFrame | None:
    """The ops (op_id, start_ns, end_ns) that made this bucket's accesses, from the pieces pass 1 wrote
    beside them: an ATI runs from the end of the op of one access to the start of the next
    (`memlens.analysis.ati`), so the bucket needs its ops' end times. None when there are none."""
    found = [np.load(p) for p in pieces(scratch, "ops", bucket)]
    found = [f for f in found if len(f)]
    if not found:
        return None
    rows = np.unique(np.concatenate(found))  # an op whose accesses straddle two batches comes twice
    return pd.DataFrame({name: rows[name] for name in OP_DTYPE.names})

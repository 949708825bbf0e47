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
    """Task: split some row groups of ``accesses`` into bucket pieces; returns rows per bucket."""
    counts = np.zeros(n_buckets, dtype=np.int64)
    for sub, df in enumerate(files.iter_batches("accesses", row_groups, BATCH_ROWS, list(ACCESS_DTYPE.names))):
        rec = np.empty(len(df), dtype=ACCESS_DTYPE)
        for name in ACCESS_DTYPE.names:
            rec[name] = df[name].to_numpy(dtype=ACCESS_DTYPE[name])
        del df
        counts += _write_split(rec, rec["block_id"], n_buckets,
                               lambda b, piece: np.save(_access_piece(Path(scratch), b, part, sub), piece))
    return counts


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
                         ops=conform("ops", _ops_of(files, accesses["op_id"].to_numpy() if len(accesses) else None)),
                         metadata=dict(files.metadata))
    trace._span = (int(span[0]), int(span[1]))
    trace._has_accesses = has_accesses
    return trace


OPS_BATCH_ROWS = 1 << 20


def _ops_of(files, op_ids) -> pd.DataFrame | None:
    """The ops (op_id, start_ns, end_ns) that made this bucket's accesses, read a row-group batch at a time:
    an ATI runs from the end of the op of one access to the start of the next (`memlens.analysis.ati`), so
    the bucket needs its ops' end times. None when the trace has no ops table or the bucket no access."""
    if op_ids is None or "ops" not in getattr(files, "files", {}):
        return None
    wanted = np.unique(np.asarray(op_ids, dtype=np.int64))
    found = []
    for rgs in files.batches("ops", OPS_BATCH_ROWS):
        part = files.read("ops", rgs, columns=["op_id", "start_ns", "end_ns"])
        keep = np.isin(part["op_id"].to_numpy(np.int64), wanted)
        if keep.any():
            found.append(part[keep])
    if not found:
        return None
    return pd.concat(found, ignore_index=True)

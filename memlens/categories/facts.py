"""What a rule's matcher reads for every block of a trace, tested the cheap way: each distinct text (frame,
function, file, module, op, annotation name) is tested once by the regex, and the answer spread to the
blocks by codes. Stack answers are reduced per stack (any frame) and mapped to blocks by ``stack_id``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def _test_distinct(values: np.ndarray, regex) -> np.ndarray:
    """bool per value: does `regex` occur in it; each distinct value is searched once."""
    codes, uniques = pd.factorize(pd.Series(values, dtype=object).fillna(""))
    hits = np.fromiter((regex.search(str(u)) is not None for u in uniques), dtype=bool, count=len(uniques))
    return hits[codes] if len(codes) else np.zeros(0, dtype=bool)


class BlockFacts:
    """The texts of `trace`'s blocks that rules match against; built lazily, one field at a time."""

    def __init__(self, trace):
        self.trace = trace
        self.blocks = trace.blocks
        self.n = len(self.blocks)
        self._stacks = None  # (stack ids in order, row starts, frame rows sorted by stack and depth)
        self._stack_text = None
        sid = pd.array(self.blocks["stack_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
        self.block_stack = sid

    # ---- per stack ---------------------------------------------------------------------------------
    def _frames(self):
        if self._stacks is None:
            st = self.trace.stacks
            if st is None or len(st) == 0:
                self._stacks = (np.zeros(0, np.int64), np.zeros(0, np.int64), None)
            else:
                st = st.sort_values(["stack_id", "depth"], kind="stable").reset_index(drop=True)
                ids = st["stack_id"].to_numpy(dtype=np.int64)
                starts = np.concatenate([[0], np.flatnonzero(np.diff(ids)) + 1]).astype(np.int64)
                files = st["filename"].astype(str).str.replace("\\", "/", regex=False).to_numpy(dtype=object)
                names = st["name"].astype(str).to_numpy(dtype=object)
                lines = st["line"].astype("int64").astype(str).to_numpy(dtype=object)
                frames = files + ":" + lines + " " + names
                self._stacks = (ids[starts], starts, {"file": files, "function": names, "frame": frames})
        return self._stacks

    def _per_block(self, stack_ids: np.ndarray, per_stack: np.ndarray) -> np.ndarray:
        """Spread a bool per stack onto the blocks (False for blocks without a known stack)."""
        out = np.zeros(self.n, dtype=bool)
        if len(stack_ids) == 0:
            return out
        pos = pd.Index(stack_ids).get_indexer(self.block_stack)
        ok = (self.block_stack >= 0) & (pos >= 0)
        out[ok] = per_stack[pos[ok]]
        return out

    def stack_match(self, field: str, regex) -> np.ndarray:
        """bool per block: `regex` found in any frame's `field` ("frame", "function", "file") or in the
        whole ``stack`` text."""
        ids, starts, cols = self._frames()
        if cols is None:
            return np.zeros(self.n, dtype=bool)
        if field == "stack":
            if self._stack_text is None:
                ends = np.append(starts[1:], len(cols["frame"]))
                frames = cols["frame"]
                self._stack_text = np.array(["\n".join(frames[a:b]) for a, b in zip(starts, ends)], dtype=object)
            return self._per_block(ids, _test_distinct(self._stack_text, regex))
        hit = _test_distinct(cols[field], regex)
        return self._per_block(ids, np.logical_or.reduceat(hit, starts))

    # ---- per block ---------------------------------------------------------------------------------
    def column_match(self, values: np.ndarray, regex) -> np.ndarray:
        return _test_distinct(values, regex)

    def column(self, field: str) -> np.ndarray:
        """The block texts of `field` "module", "op", "phase" or "builtin"."""
        b = self.blocks
        if field == "builtin":  # memlens's own category, also on a trace categorised by rules before
            return b["builtin_category" if "builtin_category" in b.columns else "category"].astype(str).to_numpy(
                dtype=object)
        if field == "phase":
            return self._phases()
        return b[field].astype(str).to_numpy(dtype=object) if field in b.columns else np.full(self.n, "", object)

    def _phases(self) -> np.ndarray:
        """The phase of each block's allocation: the snapshot story's ``phase`` column, else the ``phase``
        of the op that allocated it (recordings: forward / backward / optimizer / other)."""
        b = self.blocks
        if "phase" in b.columns:
            return b["phase"].astype(str).to_numpy(dtype=object)
        ops = self.trace.ops
        out = np.full(self.n, "", dtype=object)
        if ops is None or len(ops) == 0 or "phase" not in ops.columns:
            return out
        op_id = pd.array(b["alloc_op_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
        pos = pd.Index(ops["op_id"].to_numpy()).get_indexer(op_id)
        ok = (op_id >= 0) & (pos >= 0)
        out[ok] = ops["phase"].astype(str).to_numpy(dtype=object)[pos[ok]]
        return out

    def annotation_match(self, regex) -> np.ndarray:
        """bool per block: allocated (alloc_ns known) inside a record_function range whose name matches."""
        ops = self.trace.ops
        out = np.zeros(self.n, dtype=bool)
        if ops is None or len(ops) == 0 or "kind" not in ops.columns:
            return out
        ann = ops[ops["kind"].astype(str) == "annotation"]
        if len(ann) == 0:
            return out
        ann = ann[_test_distinct(ann["name"].to_numpy(dtype=object), regex)]
        if len(ann) == 0:
            return out
        order = np.argsort(ann["start_ns"].to_numpy(dtype=np.int64), kind="stable")
        start = ann["start_ns"].to_numpy(dtype=np.int64)[order]
        reach = np.maximum.accumulate(ann["end_ns"].to_numpy(dtype=np.int64)[order])  # furthest end so far
        t = self.blocks["alloc_ns"].to_numpy(dtype="float64", na_value=np.nan)
        known = ~np.isnan(t)
        tk = t[known].astype(np.int64)
        at = np.searchsorted(start, tk, side="right") - 1  # the last range starting at or before t
        out[known] = (at >= 0) & (reach[np.maximum(at, 0)] >= tk)
        return out

"""The source line behind an allocation site: the text of ``file.py:line`` beside its bytes at the peak.

A site (`memlens.analysis.peak_cause.stack_sites`) is the innermost Python frame of a block's stack outside
torch. Its file is looked up either under a source root the user gives (``--source-root DIR``: the frame's
path is matched by its longest tail that exists under DIR, so a trace recorded on another machine finds the
same file in the user's checkout) or, without a root, where the frame points when that file exists here.

Files are read safely, since a trace names them and a trace may come from anyone: only ``.py`` files that
are regular files of at most `MAX_FILE_BYTES`, decoded as UTF-8 with undecodable bytes replaced; under a
root, never a path that leaves it ("..", or a symlink pointing outside); one line of at most
`MAX_LINE_CHARS` characters is shown.
"""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np
import pandas as pd

from memlens.analysis.peak_cause import site_frames
from memlens.errors import InputError

MAX_FILE_BYTES = 4 << 20  # a Python source file larger than this is generated code, not worth reading
MAX_LINE_CHARS = 160


class SourceReader:
    """Reads lines of the files a trace's frames name; `root` (a directory) or None (the frames' own paths).
    `within`: when given, a callable that says whether a local path may be read (a server's trust boundary);
    files it refuses are treated as not found. Files are read once and kept for the reader's life."""

    def __init__(self, root=None, within=None):
        self.within = within
        self.root = None
        if root is not None:
            if not os.path.isdir(root):
                raise InputError(f"--source-root {root}: not a directory")
            self.root = os.path.realpath(root)
        self._lines: dict[str, list[str] | None] = {}
        self._where: dict[str, str | None] = {}

    def resolve(self, filename: str) -> str | None:
        """The local path of the frame's file, or None (not found, not a .py file, or outside the root)."""
        filename = str(filename)
        if filename not in self._where:
            found = self._resolve(filename)
            if found is not None and self.within is not None and not self.within(found):
                found = None
            self._where[filename] = found
        return self._where[filename]

    def _resolve(self, filename: str) -> str | None:
        if not filename.endswith(".py") or "\x00" in filename:
            return None
        if self.root is None:
            return filename if os.path.isabs(filename) and os.path.isfile(filename) else None
        path = PureWindowsPath(filename) if "\\" in filename else PurePosixPath(filename)
        parts = [p for p in path.parts if p not in ("", ".", "/", "\\") and not p.endswith((":", ":\\"))]
        if ".." in parts:
            return None
        for k in range(len(parts)):  # the longest tail of the frame's path that exists under the root
            candidate = os.path.realpath(os.path.join(self.root, *parts[k:]))
            inside = candidate.startswith(self.root.rstrip(os.sep) + os.sep)
            if inside and os.path.isfile(candidate):
                return candidate
        return None

    def line(self, filename: str, lineno) -> str | None:
        """Line `lineno` (1-based) of the frame's file, stripped and cut to `MAX_LINE_CHARS`; None when the file
        cannot be found or read or has no such line."""
        try:
            lineno = int(lineno)
        except (TypeError, ValueError):
            return None
        path = self.resolve(filename)
        if path is None or lineno < 1:
            return None
        if path not in self._lines:
            self._lines[path] = _read_lines(path)
        lines = self._lines[path]
        if lines is None or lineno > len(lines):
            return None
        text = lines[lineno - 1].expandtabs(4).strip()
        return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS - 3] + "..."


def _read_lines(path: str) -> list[str] | None:
    try:
        with open(path, "rb") as f:
            if not os.path.isfile(path) or os.fstat(f.fileno()).st_size > MAX_FILE_BYTES:
                return None
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_FILE_BYTES:
        return None
    return data.decode("utf-8", errors="replace").splitlines()


def add_source_lines(trace, sites: pd.DataFrame, source_root=None, reader: SourceReader | None = None) -> pd.DataFrame:
    """`sites` (a `peak_cause.sites` frame) with ``source``: the text of each site's line (from the stack of
    its largest block), or None where the site has no Python frame or its file is not found."""
    reader = reader or SourceReader(source_root)
    frames = site_frames(getattr(trace, "stacks", None)).set_index("stack_id")
    out = sites.copy()
    text = []
    for sid in pd.array(out["stack_id"], dtype="Int64") if "stack_id" in out else []:
        if pd.isna(sid) or int(sid) not in frames.index:
            text.append(None)
            continue
        f = frames.loc[int(sid)]
        text.append(reader.line(f["filename"], f["line"]))
    out["source"] = pd.Series(text, index=out.index, dtype=object) if len(out) else pd.Series(dtype=object)
    return out


def by_file(trace, blocks: pd.DataFrame, source_root=None, reader: SourceReader | None = None) -> pd.DataFrame:
    """Bytes of `blocks` (e.g. those live at a peak) per source file of their site frame: ``file`` (the path the
    frame names), ``bytes``, ``blocks``, ``lines`` (distinct site lines), ``found`` (the local path read, or
    None); largest first. Blocks without a Python frame are left out."""
    reader = reader or SourceReader(source_root)
    frames = site_frames(getattr(trace, "stacks", None)).set_index("stack_id")
    cols = ["file", "bytes", "blocks", "lines", "found"]
    sid = pd.array(blocks["stack_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
    keep = np.isin(sid, frames.index.to_numpy()) if len(frames) else np.zeros(len(sid), bool)
    if not keep.any():
        return pd.DataFrame(columns=cols)
    f = frames.loc[sid[keep]]
    df = pd.DataFrame({"file": f["filename"].to_numpy(), "line": f["line"].to_numpy(),
                       "size": blocks["size"].to_numpy(np.int64)[keep]})
    g = df.groupby("file", sort=False)
    out = pd.DataFrame({"bytes": g["size"].sum(), "blocks": g.size(), "lines": g["line"].nunique()})
    out.index.name = "file"
    out = out.reset_index().sort_values(["bytes", "file"], ascending=[False, True], kind="stable")
    out["found"] = [reader.resolve(name) for name in out["file"]]
    return out[cols].reset_index(drop=True)


def top_site_sources(trace, top_sites: list[dict], source_root=None, reader: SourceReader | None = None) -> None:
    """Add ``source`` (the line's text) to each ``{"site", "bytes"}`` of `top_sites` whose label names a site
    frame of the trace's stacks and whose file is found; in place."""
    reader = reader or SourceReader(source_root)
    stacks = getattr(trace, "stacks", None)
    if stacks is None or len(stacks) == 0 or not top_sites:
        return
    # only the stacks holding a frame named by a label ("file.py:LINE FUNCTION"): `memlens info` runs this on
    # every file, and a snapshot has tens of thousands of frames
    wanted = set()
    for entry in top_sites:
        head, _, function = str(entry["site"]).partition(" ")
        line = head.rpartition(":")[2]
        if head.endswith(".py:" + line) and line.isdigit():
            wanted.add((int(line), function))
    if not wanted:
        return
    near = stacks[stacks["line"].isin({ln for ln, _ in wanted}).to_numpy()]  # ints first: cheap
    ids = np.unique(near["stack_id"].to_numpy()[near["name"].astype(str).isin({fn for _, fn in wanted}).to_numpy()])
    frames = site_frames(stacks[stacks["stack_id"].isin(ids).to_numpy()]).drop_duplicates("site").set_index("site")
    for entry in top_sites:
        if entry["site"] in frames.index:
            f = frames.loc[entry["site"]]
            text = reader.line(f["filename"], f["line"])
            if text is not None:
                entry["source"] = text

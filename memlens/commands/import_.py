"""`memlens import SRC -o DST.memlens`: convert any supported file into memlens's own trace format."""
from __future__ import annotations

from memlens.commands import options

from pathlib import Path

_SUFFIXES = (".pickle", ".pkl", ".json.gz", ".json", ".raw.gz", ".gz", ".csv", ".memlens")


def default_output(src: str) -> Path:
    """`SRC`'s name without its format suffixes plus ".memlens", in the current directory."""
    name = Path(src.rstrip("/\\")).name
    for suffix in (".pt.trace.json.gz", ".pt.trace.json", ".raw.json.gz") + _SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return Path(f"{name}.memlens")


STREAM_ABOVE_BYTES = 256 << 20  # a buffer-lifetime CSV or snapshot this large is converted without a Trace
_STREAMED_FORMATS = ("lifetimes_csv", "cuda_snapshot", "kineto")


def _streamed(args) -> str | None:
    """The format of `args.src` when it is large enough to convert without building a `Trace` (a
    buffer-lifetime CSV a chunk at a time: the in-memory import holds ~200 bytes per buffer, the chunked
    one 8; a CUDA snapshot with its events written in row groups: see `memlens.io.snapshot.convert`; a
    Kineto trace read a piece at a time, keeping only the events the importer reads, then saved as
    usual: `memlens.io.kineto.stream`), else None."""
    import os

    from memlens.io.detect import detect_format
    src = Path(args.src)
    if not src.is_file() or os.path.getsize(src) < STREAM_ABOVE_BYTES:
        return None
    kind = args.format or detect_format(src)
    return kind if kind in _STREAMED_FORMATS else None


def register(sub) -> None:
    p = sub.add_parser("import", help="convert a snapshot / profiler trace / CSV into a .memlens trace",
                       description="Read a CUDA memory snapshot pickle, a Kineto/Chrome trace, a torch.profiler "
                                   "memory-timeline export or a buffer-lifetime CSV (detected from the content) "
                                   "and save it as a .memlens trace directory.")
    p.add_argument("src", help="the file to import")
    p.add_argument("-o", "--output", type=options.output_path, help="destination NAME.memlens (default: SRC's name + .memlens here)")
    p.add_argument("--format", help="force a format instead of detecting it "
                                    "(cuda_snapshot, kineto, memory_timeline, lifetimes_csv, memlens)")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it is already a memlens trace")
    p.add_argument("--json", action="store_true", help="print the summary of the imported trace as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from memlens.commands._output import print_json
    from memlens.errors import InputError
    from memlens.io import load
    from memlens.units import format_bytes, format_ns

    dst = Path(args.output) if args.output else default_output(args.src)
    if dst.exists() and not args.overwrite:
        raise InputError("already exists (pass --overwrite to replace it)", dst)
    kind = _streamed(args)
    if kind in ("lifetimes_csv", "cuda_snapshot"):
        import json

        from memlens.trace.tracedir import MANIFEST
        if kind == "lifetimes_csv":
            from memlens.io.lifetimes_csv import convert_lifetimes_csv as convert
            how = "converted in chunks"
        else:
            from memlens.io.snapshot.convert import convert_snapshot as convert
            how = "events written in row groups"
        written = convert(args.src, dst, overwrite=args.overwrite)
        manifest = json.loads((Path(written) / MANIFEST).read_text())
        counts = {name: manifest["tables"][name]["rows"] for name in ("blocks", "events")
                  if name in manifest["tables"] and (name == "blocks" or kind == "cuda_snapshot")}
        if args.json:
            print_json({"output": str(written), "source_kind": kind, **counts, "streamed": True})
            return 0
        said = ", ".join(f"{rows:,} {name}" for name, rows in counts.items())
        print(f"imported {args.src} ({kind}, {how}) -> {written}: {said}; "
              "`memlens info --engine dask` summarises it out of core")
        if kind == "cuda_snapshot":
            for note in manifest["metadata"].get("notes", []):
                print(f"note: {note}")
        return 0
    if kind == "kineto":
        from memlens.io.detect import validated
        from memlens.io.kineto.stream import import_kineto_streamed
        trace = validated(import_kineto_streamed(args.src), args.src)
    else:
        trace = load(args.src, format=args.format)
    written = trace.save(dst, overwrite=args.overwrite)
    s = trace.summary()
    if args.json:
        print_json({"output": str(written), **s, **({"streamed": True} if kind == "kineto" else {})})
        return 0
    peaks = ", ".join(f"{dev} {format_bytes(peak)}" for dev, peak in s["peak_live_bytes"].items())
    print(f"imported {args.src} ({s['source_kind']}) -> {written}: {s['blocks']:,} blocks, {s['ops']:,} ops, "
          f"{format_ns(s['duration_ns'])}, peak live {peaks or 'n/a'}")
    for note in s["notes"]:
        print(f"note: {note}")
    return 0

"""Read a big Kineto / Chrome trace JSON without holding its text or the events memlens does not use.

`memlens.io.jsonfile.load_json` reads the whole file (decompressed) and parses every event into a dict: for a
trace of a few GB that is the text plus several times it in Python objects, most of them kernel, runtime and
flow events the importer never looks at. `read_kineto_filtered` decodes the file a piece (1 MiB) at a time
with the standard library's JSON decoder, one ``traceEvents`` element at a time, and keeps only the events
`memlens.io.kineto.importer.kineto_to_trace` reads: ``[memory]`` instants and the complete (``ph == "X"``) spans of
ops, ``nn.Module:`` calls and ``ProfilerStep#`` ranges, each with only the fields it reads (`slim_event`);
runtime calls and GPU kernels / copies / memsets go to flat arrays (`memlens.io.kineto.kernels.GpuEvents`).
The top-level keys other than ``traceEvents`` are kept as they are. The `Trace` built from that is the one the in-memory import builds (tested), then saved as usual:
the memory events and ops are still held whole (the attribution of each memory event to its innermost op on
its thread needs every op).
"""
from __future__ import annotations

import codecs
import gzip
import json
import zlib
from pathlib import Path

from memlens import limits
from memlens.errors import InputError, reading_file
from memlens.io.kineto.ops import OP_CATEGORIES

READ_CHARS = 1 << 20  # bytes read (and decoded) at a time
MAX_VALUE_CHARS = 64 << 20  # longer than any one event: a value still undecodable this far on is bad JSON


def kept_by_the_importer(event) -> bool:
    """Whether `kineto_to_trace` reads `event` as an event: a ``[memory]`` event, or a complete span of an
    op, module call or profiler step (`memlens.io.kineto.ops`). (Runtime calls and GPU activity go to a
    `memlens.io.kineto.kernels.GpuEvents` instead, as flat arrays.)"""
    from memlens.io.kineto.ops import _MODULE_PREFIX, _STEP_PREFIX
    if type(event) is not dict:
        return False
    name = event.get("name")
    if name == "[memory]":
        return True
    if event.get("ph") != "X":
        return False
    return event.get("cat") in OP_CATEGORIES or str(name if name is not None else "").startswith(
        (_MODULE_PREFIX, _STEP_PREFIX))


_EVENT_KEYS = ("name", "ph", "cat", "ts", "dur", "pid", "tid")  # what `kineto_to_trace` reads of an event
_MEMORY_ARGS = ("Bytes", "Device Type", "Device Id", "Addr", "Total Allocated", "Total Reserved", "Ev Idx")
# ops: their id, the logged inputs (`memlens.io.kineto.facts.ARG_KEYS`) and what a collective moved
# (`memlens.io.kineto.comms.COMM_ARGS`)
_OP_ARGS = ("External id", "Input Dims", "Input type", "Input Strides", "Concrete Inputs", "Collective name",
            "In msg nelems", "Out msg nelems", "Group size", "dtype")
_SHARED_VALUES = ("name", "ph", "cat", "pid", "tid")  # repeated from event to event: one object each


def slim_event(event: dict, shared: dict) -> dict:
    """A kept event with only the keys the importer reads (a real op's args also carry call stacks and
    ids it does not read), its keys and repeated values the
    same objects across events (each decode makes its own copies). `shared`: the distinct values seen so
    far. Anything the importer would refuse (args that are not a dict) is kept as it is."""
    out = {}
    for key in _EVENT_KEYS:
        if key in event:
            value = event[key]
            if key in _SHARED_VALUES and type(value) in (str, int):
                value = shared.setdefault((type(value), value), value)
            out[key] = value
    if "args" in event:
        args = event["args"]
        if type(args) is dict:
            wanted = _MEMORY_ARGS if event.get("name") == "[memory]" else _OP_ARGS
            args = {key: args[key] for key in wanted if key in args}
        out["args"] = args
    return out


class _Text:
    """The file's text, decoded a piece at a time, with a cursor; consumed text is dropped."""

    def __init__(self, stream, path: Path):
        self._stream, self.path = stream, path
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self.buf, self.pos, self.consumed, self.eof = "", 0, 0, False

    def more(self) -> bool:
        """Read another piece; False at the end of the file."""
        if self.eof:
            return False
        try:
            raw = self._stream.read(READ_CHARS)
            text = self._decoder.decode(raw, final=not raw)
        except UnicodeDecodeError:
            raise InputError("not a Kineto/Chrome trace file: the content is not UTF-8 text", self.path) from None
        except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            raise InputError(f"not a readable gzip / JSON file ({exc})", self.path) from None
        if not raw:
            self.eof = True
        if self.pos > READ_CHARS:  # drop what was parsed already
            self.consumed += self.pos
            self.buf, self.pos = self.buf[self.pos:], 0
        self.buf += text
        return bool(raw) or bool(text)

    def peek(self) -> str:
        """The next non-blank character ("" at the end), the cursor moved onto it."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return ""

    def expect(self, char: str) -> None:
        if self.peek() != char:
            self.fail(f"expected '{char}'")
        self.pos += 1

    def value(self, decoder: json.JSONDecoder):
        """The JSON value at the cursor. A value the buffer cuts short is decoded again with more text; an
        error with `MAX_VALUE_CHARS` read past the cursor (or at the end of the file) is bad JSON."""
        self.peek()
        while True:
            try:
                obj, end = decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if len(self.buf) - self.pos < MAX_VALUE_CHARS and self.more():
                    continue
                self.fail(exc.msg, at=exc.pos)
            except RecursionError:
                raise InputError("not a Kineto/Chrome trace file: JSON nested too deeply", self.path) from None
            if end >= len(self.buf) and type(obj) in (int, float) and self.more():
                continue  # a number the buffer may cut short: decode it again with what follows
            self.pos = end
            return obj

    def fail(self, what: str, at: int | None = None):
        offset = self.consumed + (self.pos if at is None else at)
        hint = " (truncated?)" if self.eof and (at if at is not None else self.pos) >= len(self.buf.rstrip()) - 1 else ""
        raise InputError(f"invalid JSON at character {offset:,}: {what}{hint}", self.path)


def read_kineto_filtered(path, gpu=None):
    """The trace at `path` (plain or gzip JSON) as `kineto_to_trace` takes it, with only the events
    `kept_by_the_importer` in ``traceEvents`` (a bare event list gives a list); runtime calls and GPU
    activity go to `gpu` (a `memlens.io.kineto.kernels.GpuEvents`) when given, else are dropped. Bad JSON
    raises `InputError` naming the file and the character where it stops making sense."""
    path = Path(path)
    limits.check_input_file(path, "Kineto trace")
    with reading_file(path), open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as stream:
        return _read_document(_Text(stream, path), gpu)


def _read_events(text: _Text, decoder: json.JSONDecoder, gpu) -> list:
    """The kept elements of the JSON array at the cursor (GPU events into `gpu`, when given)."""
    kept, shared = [], {}
    text.expect("[")
    if text.peek() == "]":
        text.pos += 1
        return kept
    while True:
        event = text.value(decoder)
        if gpu is not None and gpu.add(event):
            pass
        elif kept_by_the_importer(event):
            limits.check_nesting(event, text.path)
            kept.append(slim_event(event, shared))
        nxt = text.peek()
        text.pos += 1
        if nxt == "]":
            return kept
        if nxt != ",":
            text.pos -= 1
            text.fail("expected ',' or ']' between events")


def _read_document(text: _Text, gpu=None):
    decoder = json.JSONDecoder()
    first = text.peek()
    if first == "":
        raise InputError("file is empty", text.path)
    if first == "[":
        doc = _read_events(text, decoder, gpu)
    elif first == "{":
        doc = {}
        text.pos += 1
        if text.peek() == "}":
            text.pos += 1
        else:
            while True:
                if text.peek() != '"':
                    text.fail("expected a key")
                key = text.value(decoder)
                text.expect(":")
                if key == "traceEvents" and text.peek() == "[":
                    doc[key] = _read_events(text, decoder, gpu)
                else:
                    doc[key] = text.value(decoder)
                    limits.check_nesting(doc[key], text.path)
                nxt = text.peek()
                text.pos += 1
                if nxt == "}":
                    break
                if nxt != ",":
                    text.pos -= 1
                    text.fail("expected ',' or '}' between keys")
    else:
        return text.value(decoder)  # not an object or array: the importer says what it is
    if text.peek() != "":
        text.fail("extra data after the document")
    return doc


def import_kineto_streamed(path):
    """`memlens.io.kineto.importer.import_kineto` reading the file with `read_kineto_filtered`: the same `Trace`,
    without the file's text or the events the importer does not read in memory."""
    from memlens.io.detect import require_kineto
    from memlens.io.kineto.importer import kineto_to_trace
    from memlens.io.kineto.kernels import GpuEvents
    require_kineto(path)
    gpu = GpuEvents()
    return kineto_to_trace(read_kineto_filtered(path, gpu), source=str(path), path=path, gpu_events=gpu)

"""`memlens mcp`: memlens's questions as tools of a Model Context Protocol server (stdio), for AI assistants.

Each tool takes a trace path (any file `memlens.load` reads) and answers with compact JSON text, the same
numbers `memlens info --json` / `diff --json` / `simulate --json` print: bytes and nanoseconds throughout.
The official ``mcp`` package is an optional extra (``pip install 'memlens[mcp]'``); it is imported only
when the server is built, so that ``import memlens`` and every other verb stay light.

While a tool runs, anything written to stdout goes to stderr instead: stdout carries the protocol's
messages, and a stray print (a library's progress line) would corrupt it.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import os
import sys

from memlens.errors import InputError
from memlens.mcp_guard import Roots, check_arguments, clip, roots_from_uris, start_roots

SERVER_NAME = "memlens"
MAX_ROWS = 200  # the most rows a tool returns in one table: an assistant's context is small
_CACHE_SIZE = 2  # traces kept loaded between calls (an assistant asks several questions of one file)
_cache: dict[tuple, object] = {}
_START_ROOTS: list[str] = []  # `memlens mcp --root DIR`
_ROOTS = contextvars.ContextVar("memlens_mcp_roots", default=None)  # the roots of the call being answered
_BOUNDARY = ("\n\nReads only files inside the server's roots (the client's roots, else the server's working "
             "directory, plus `memlens mcp --root DIR`); paths and options at most 4096 characters.")


def current_roots() -> Roots:
    """The roots of the tool call being answered (the working directory when called outside the server)."""
    return _ROOTS.get() or Roots([os.getcwd(), *_START_ROOTS])


def require_mcp():
    """Import the ``mcp`` package, or raise `InputError` saying how to install the extra."""
    try:
        import mcp.server.mcpserver as mcpserver
    except ImportError as exc:
        from memlens.install_hint import extra_install_command
        raise InputError("memlens mcp needs the 'mcp' package (the Model Context Protocol SDK, version 2 or "
                         f"later): {extra_install_command('mcp')}" + (f" ({exc})" if "mcpserver" in str(exc) else "")
                         ) from None
    return mcpserver


def load_cached(path: str):
    """`memlens.load(path)`, kept for the next call while the file is unchanged (same size and mtime)."""
    from memlens.io import load

    real = os.path.realpath(str(path))
    try:
        st = os.stat(real)
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or 'cannot be read'}") from None
    key = (real, st.st_size, st.st_mtime_ns)
    if key not in _cache:
        trace = load(str(path))
        while len(_cache) >= _CACHE_SIZE:
            _cache.pop(next(iter(_cache)))
        _cache[key] = trace
    return _cache[key]


def _dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), default=str)


def _rows(n, default: int = 20) -> int:
    return max(1, min(int(default if n is None else n), MAX_ROWS))


def info(path: str) -> dict:
    """The `memlens info --json` summary of one trace: blocks, ops, devices, duration (ns), peak live bytes
    per device, and the peak story (allocated and reserved bytes, bytes by category, the cause sentence, the
    top allocation sites, iterations, phases)."""
    from memlens.analysis.peak_story import peak_story
    trace = load_cached(path)
    return {**trace.summary(), **peak_story(trace, reader=_source_reader(None))}


def peak_cause(path: str, device: str | None = None) -> dict:
    """{device: the peak's cause}: ``allocated_bytes``, ``reserved_bytes``, ``by_category`` (bytes),
    ``pushed`` (the category and op whose allocations pushed memory to the peak, bytes), ``phase``,
    ``peak_ns`` and the ``cause`` sentence."""
    from memlens.analysis.peak_cause import peak_cause as causes
    trace = load_cached(path)
    out = {}
    for dev, c in causes(trace, top_sites=0).items():
        if device is None or dev == device:
            out[dev] = {**c.to_dict(), "pushed": dict(c.pushed)}
            out[dev].pop("top_sites", None)
    if device is not None and not out:
        raise InputError(f"{path}: no device {device} (it has: {', '.join(trace.devices) or 'none'})")
    return out


def sites(path: str, device: str | None = None, top: int | None = 20, by: str = "site",
          source_root: str | None = None) -> dict:
    """{device: rows} of the allocation sites live at each device's peak, largest first: ``site``
    ("file.py:line function"), ``bytes``, ``blocks``, ``category``, ``op``; with `source_root` (or when the
    frames' files exist inside the server's roots) also ``source`` (the text of that line). `by` "stack" splits a line by caller."""
    from memlens.analysis.peak import live_at, peak_breakdown
    from memlens.analysis.peak_cause import sites as site_table
    if by not in ("site", "stack"):
        raise InputError(f"by must be 'site' or 'stack', got {by!r}")
    trace = load_cached(path)
    out = {}
    for dev, pb in peak_breakdown(trace, largest=0).items():
        if device is not None and dev != device:
            continue
        df = site_table(trace, blocks=live_at(trace, dev, pb.peak_seq, pb.peak_ns), by=by).head(_rows(top))
        df = _with_source(trace, df, source_root)
        out[dev] = [{k: (None if v is None or (isinstance(v, float) and v != v) else
                         int(v) if k in ("bytes", "blocks") else str(v)) for k, v in r.items() if k != "stack_id"}
                    for r in df.to_dict(orient="records")]
    if device is not None and not out:
        raise InputError(f"{path}: no device {device} (it has: {', '.join(trace.devices) or 'none'})")
    return out


def _source_reader(source_root):
    """A `SourceReader` that reads only files inside the call's roots."""
    from memlens.analysis.source import SourceReader
    return SourceReader(source_root, within=current_roots().contains)


def _with_source(trace, df, source_root):
    from memlens.analysis.source import add_source_lines
    return add_source_lines(trace, df, reader=_source_reader(source_root))


def diff(path_a: str, path_b: str, top: int | None = 10) -> dict:
    """`memlens diff A B --json` cut to `top` rows per table: peak bytes of A and B per device pair, what is
    live at each peak by category / module / op, blocks that appear or vanish, iterations, ATI, and what could
    not be compared."""
    from memlens.analysis.diff import diff as compare
    d = compare(load_cached(path_a), load_cached(path_b), name_a=path_a, name_b=path_b)
    out = d.to_dict(top=_rows(top, 10))
    out["summary"] = d.summary()
    return out


def simulate(path: str, allocator: str = "caching", conf: str | None = None, capacity: str | None = None,
             device: str | None = None) -> dict:
    """{device: results} of replaying the trace's requests through an allocator model (`caching`: PyTorch's
    CUDACachingAllocator under `conf`, a PYTORCH_CUDA_ALLOC_CONF string; or `malloc`, `bestfit`, `bump`):
    peak reserved / allocated bytes, segment reservations (count and bytes), OOMs, and the recorded reserved
    peak when the trace has one. `capacity` e.g. "80GB"."""
    from memlens.simulate import simulate as replay
    if allocator not in ("caching", "malloc", "bestfit", "bump"):
        raise InputError(f"allocator must be caching, malloc, bestfit or bump, got {allocator!r}")
    trace = load_cached(path)
    if device is not None and device not in trace.devices:
        raise InputError(f"{path}: no device {device} (it has: {', '.join(trace.devices) or 'none'})")
    result = replay(trace, allocator=allocator, conf=conf, capacity=capacity, device=device)
    out = {}
    for dev, s in result.to_dict().items():
        s = dict(s)
        allocs = s.pop("segment_allocs")
        s.pop("segment_alloc_times_ns", None)
        frees = s.pop("segment_frees")
        s.update(segment_allocs=len(allocs), segment_alloc_bytes=int(sum(allocs)), segment_frees=len(frees),
                 ooms=s["ooms"][:10])
        if isinstance(s.get("recorded"), dict):
            rec = dict(s["recorded"])
            rec = {k: (len(v) if isinstance(v, (list, tuple)) else v) for k, v in rec.items()}
            s["recorded"] = rec
        out[dev] = s
    return out


def predict(script: str, args: list[str] | None = None, gpu: str = "H100", capacity: str | None = None,
            conf: str | None = None, timeout_s: float = 600.0) -> dict:
    """`memlens predict --json -- python SCRIPT ARGS`: run a training/inference script on fake CUDA tensors
    (no GPU) and predict its peak allocated / reserved bytes on `gpu` (a GPU name, or a .json GPU file inside
    the roots). Only a .py file inside the server's roots runs, in a child process (its prints cannot reach the
    protocol stream), with `args` as its command-line arguments (data, never a shell), at most `timeout_s`
    seconds."""
    options = [f"--gpu={gpu}"] + ([f"--capacity={capacity}"] if capacity else []) + ([f"--conf={conf}"] if conf else [])
    return _child_json("predict", options, script, args, timeout_s, "prediction")


def _child_json(verb: str, options: list[str], script: str, args, timeout_s: float, what: str) -> dict:
    """`memlens VERB --json OPTIONS -- python SCRIPT ARGS` in a child process (the script's prints cannot
    reach the protocol stream), its JSON document; `InputError` with the child's last error line when there
    is none, or when it runs past `timeout_s` seconds."""
    import subprocess
    if not os.path.isfile(script):
        raise InputError(f"{clip(script)}: no such script")
    # options as `--name=value` and the script as an absolute path: no value can be read as another option
    cmd = [sys.executable, "-m", "memlens", verb, "--json", *options,
           "--", "python", os.path.realpath(script), *[str(a) for a in (args or [])]]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise InputError(f"{clip(script)}: {what} did not finish within {timeout_s:g} s") from None
    # the script's own prints share the child's stdout; `--json` writes its document last, "{" on a line of its own
    out = done.stdout
    start = 0 if out.startswith("{\n") else out.rfind("\n{\n") + 1
    try:
        return json.loads(out[start:])
    except ValueError:
        last = (done.stderr.strip().splitlines() or [f"no {what} (exit {done.returncode})"])[-1]
        raise InputError(f"{clip(script)}: {clip(last, 1000)}") from None


def advise(script: str | None = None, args: list[str] | None = None, path: str | None = None,
           gpu: str | None = None, capacity: str | None = None, world_size: int | None = None,
           objective: str = "fit", timeout_s: float = 600.0) -> dict:
    """`memlens advise --json`: changes that make a training step fit `capacity` (e.g. "40GiB" per GPU; default
    the GPU's memory) on `gpu` (default H100), each verified by predicting the step with it applied. Give
    `script` (a .py file inside the roots defining build_model() and step(model, optimizer) gets the whole
    search: checkpointing, batch, precision, sharding with `world_size`, allocator settings; any other script,
    allocator settings only), run in a child process with `args` as data, at most `timeout_s` seconds; or
    `path`, a recorded trace (allocator settings replayed; no gpu or world_size). `objective`: fit,
    fastest_fit or pareto. Returns ``plans`` (the ranked table: changes, peak_allocated, peak_reserved,
    device_bytes_needed per rank, fits, step_ns, baseline_step_ns, delta_ns modeled, recompute_ns, error),
    ``best`` (the first plan that fits, with its rank and code snippet; null when none does), ``summary``,
    ``miss_bytes``, ``notes``."""
    if (script is None) == (path is None):
        raise InputError("advise takes exactly one of script (a .py file) or path (a recorded trace)")
    if path is not None:
        if gpu is not None or world_size is not None or args:
            raise InputError("gpu, world_size and args apply to a script; a recorded trace is replayed as it ran")
        from memlens.advice.entry import advise as advise_on
        out = advise_on(load_cached(path), capacity=capacity, objective=objective).to_dict()
    else:
        options = [f"--gpu={gpu or 'H100'}", f"--objective={objective}"]
        options += [f"--capacity={capacity}"] if capacity else []
        options += [f"--world-size={int(world_size)}"] if world_size is not None else []
        out = _child_json("advise", options, script, args, timeout_s, "advice")
    out["plans"] = out["plans"][:MAX_ROWS]
    out.pop("best_snippet", None)     # the same text as best["snippet"]
    return out


TOOLS = (info, peak_cause, sites, diff, simulate, predict, advise)
_TITLES = {"info": "Summarise a memory trace", "peak_cause": "What caused the memory peak",
           "sites": "Allocation sites live at the peak", "diff": "Compare two memory traces",
           "simulate": "Replay a trace through an allocator model", "predict": "Predict a script's GPU memory",
           "advise": "Advise changes that make a training step fit a GPU"}


def _as_tool(fn, tool_error, context_type):
    """`fn` wrapped for the server: its arguments checked against the roots (the client's, else the working
    directory, plus ``--root`` ones) and their size limits, JSON text out, stdout kept off the protocol stream,
    memlens's input errors as the tool's error message (one line, naming the file)."""
    import inspect

    async def call(ctx, **kwargs) -> str:
        roots = Roots([*await _client_roots(ctx), *_START_ROOTS])
        token = _ROOTS.set(roots)
        try:
            check_arguments(fn.__name__, kwargs, roots)
            with contextlib.redirect_stdout(sys.stderr):
                return _dumps(fn(**kwargs))
        except InputError as exc:
            raise tool_error(clip(str(exc), 2000)) from None
        except (MemoryError, RecursionError) as exc:
            raise tool_error(f"the input is too large or malformed for this machine ({type(exc).__name__})") from None
        finally:
            _ROOTS.reset(token)
    sig = inspect.signature(fn)
    ctx_param = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=context_type)
    call.__signature__ = sig.replace(parameters=[*sig.parameters.values(), ctx_param], return_annotation=str)
    call.__annotations__ = {**fn.__annotations__, "ctx": context_type, "return": str}
    call.__name__, call.__doc__ = fn.__name__, fn.__doc__
    return call


async def _client_roots(ctx) -> list[str]:
    """The client's root directories when it offers them (the roots capability), else the working directory."""
    import warnings
    try:
        import anyio
        session = ctx.session
        caps = session.client_capabilities
        if caps is not None and getattr(caps, "roots", None) is not None:
            with warnings.catch_warnings(), anyio.fail_after(5):
                warnings.simplefilter("ignore")
                listed = await session.list_roots()
            dirs = roots_from_uris(r.uri for r in listed.roots)
            if dirs:
                return dirs
    except Exception:  # noqa: BLE001 - a client that fails to list its roots gets the working directory
        pass
    return [os.getcwd()]


def build_server():
    """The `MCPServer` with memlens's tools (needs the ``mcp`` extra)."""
    mcpserver = require_mcp()
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver.exceptions import ToolError

    from memlens._version import __version__
    server = mcpserver.MCPServer(SERVER_NAME, version=__version__, instructions=(
        "memlens answers questions about PyTorch GPU memory traces (CUDA snapshots .pickle, profiler JSON, "
        ".memlens directories). Every tool takes file paths inside the server's roots (the client's roots, else "
        "the server's working directory, plus directories named with --root); sizes are bytes, times ns."))
    for fn in TOOLS:
        server.tool(name=fn.__name__, title=_TITLES[fn.__name__], description=fn.__doc__ + _BOUNDARY)(
            _as_tool(fn, ToolError, Context))
    return server


def serve(roots=()) -> None:
    """Run the server over stdio until the client closes it; `roots`: directories the tools may read and run
    inside besides the client's roots (or the working directory)."""
    import anyio

    from memlens.mcp_stdio import serve_stdio
    _START_ROOTS[:] = start_roots(roots)
    server = build_server()
    # the bounded transport drives the low-level server that MCPServer.run("stdio") would drive itself
    anyio.run(serve_stdio, server._lowlevel_server)

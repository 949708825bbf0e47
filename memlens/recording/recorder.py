"""The public recorder: ``with memlens.record(model) as rec: ...`` then ``rec.trace``.

Behaviour that users can rely on:
- Exceptions inside the block propagate unchanged; the trace of everything up to them is kept.
- An internal failure of the recorder never reaches user code: it warns, stops recording and keeps
  the trace so far (`trace.metadata["stop_reason"]` says why).
- Nested recorders each record every op of their own block (the inner one's ops appear in both);
  only the outermost one can run the allocator-level instrument, the inner ones say so in their notes.
- Recording is per thread: a recorder sees the ops of the thread that entered it (and autograd's
  backward, which runs on behalf of that thread). Several threads may record at the same time.
  Frees are caught whichever thread drops the last reference.
- Used as a decorator, each call is recorded separately; `recorder.trace` is the latest call's.
"""
from __future__ import annotations

import functools
import os
import warnings
from time import perf_counter_ns, time_ns

from memlens.recording import hooks

DEFAULT_MAX_BUFFER_BYTES = 512 << 20
BACKENDS = ("compiled", "python")
_warned_fallback: list = []


def choose_backend(requested: str | None) -> tuple[str, object, str | None]:
    """(backend, native module or None, note): `requested` (or $MEMLENS_RECORDER, default "compiled")
    unless the compiled recorder cannot be built here (one warning per process, then Python). Both
    backends record the same things, stacks included."""
    name = (requested or os.environ.get("MEMLENS_RECORDER") or "compiled").strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"recorder backend must be one of {BACKENDS}, not {name!r} (MEMLENS_RECORDER)")
    _note_backend_use()
    if name == "python":
        return "python", None, None
    from memlens.recording import native
    try:
        return "compiled", native.load(), None
    except native.NativeUnavailable as exc:
        if not _warned_fallback:
            _warned_fallback.append(True)
            warnings.warn(f"memlens: compiled recorder unavailable ({exc}); using the Python recorder",
                          RuntimeWarning, stacklevel=3)
        return "python", None, f"compiled recorder unavailable ({exc})"


def _note_backend_use() -> None:
    """Append the running test's id to $MEMLENS_RECORDER_USE_LOG when both are set: the test suite's first
    pass (.ci/run) learns which test files depend on the recorder backend, subprocesses included (they
    inherit PYTEST_CURRENT_TEST), and reruns only those with the other backend. Never raises."""
    log, test = os.environ.get("MEMLENS_RECORDER_USE_LOG"), os.environ.get("PYTEST_CURRENT_TEST")
    if not (log and test):
        return
    try:   # one short O_APPEND write per line: concurrent writers do not interleave
        with open(log, "a", encoding="utf-8") as out:
            out.write(test.replace("\n", " ")[:2000] + "\n")
    except OSError:   # a log that cannot be written only makes the second pass rerun less; never fail a record
        pass


class Recorder:
    """Records blocks, accesses and ops of the PyTorch code run inside it. See `record`."""

    # the Session type to record with (memlens.predict records fake tensors with its own subclass)
    session_class = None

    def __init__(self, model=None, *, stacks: bool = False, allocator: str | bool = "auto",
                 max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES, module_prefix: str = "model",
                 kernel_times: bool = True, backend: str | None = None, save_to=None, overwrite: bool = False):
        if allocator not in ("auto", True, False, "profiler", "none"):
            raise ValueError(f"allocator must be 'auto', 'profiler', 'none', True or False, not {allocator!r}")
        self.model = model
        self.stacks = bool(stacks)
        self.allocator = {"auto": "auto", True: "auto", "profiler": "auto", False: "none"}.get(allocator, allocator)
        self.max_buffer_bytes = int(max_buffer_bytes)
        self.module_prefix = module_prefix
        self.kernel_times = bool(kernel_times)
        self.backend = backend
        self.save_to = save_to
        self.overwrite = bool(overwrite)
        self.save_metadata: dict = {}    # save_to: keys added to the saved metadata ("notes" appended)
        self.save_fallback = None        # save_to: where to save when save_to cannot be written
        self.saved_path = None           # save_to: where the last recording was saved
        self.saved_summary = None        # save_to: its Trace.summary() numbers
        self.save_error = None           # save_to: why save_to could not be written (then saved_path is the fallback)
        self._keep_trace = False         # tests: also build `trace` in memory from the same recording
        self.trace = None
        self._session = None
        self._instruments = None
        self._clock = None

    @property
    def recording(self) -> bool:
        """True between enter and exit."""
        return self._session is not None

    # ---- context manager --------------------------------------------------------------------
    def __enter__(self) -> "Recorder":
        if self._session is not None:
            raise RuntimeError("this memlens recorder is already recording; create a new one to nest")
        from memlens.recording.instruments import Instruments
        from memlens.recording.session import Session, reap_orphaned_modes
        reap_orphaned_modes()  # recordings of this thread that another thread stopped
        self.trace = None
        self.saved_path = self.saved_summary = self.save_error = None
        if self.session_class is not None:   # a Session subclass (memlens.predict): the Python backend
            backend, native, note = "python", None, None
        else:
            backend, native, note = choose_backend(self.backend)
        if self.session_class is not None:
            session = self.session_class(model=self.model, stacks=self.stacks,
                                         max_buffer_bytes=self.max_buffer_bytes, module_prefix=self.module_prefix)
        elif backend == "compiled":
            from memlens.recording.compiled import CompiledSession
            session = CompiledSession(native=native, memory=self.allocator != "none", model=self.model,
                                      stacks=self.stacks, max_buffer_bytes=self.max_buffer_bytes,
                                      module_prefix=self.module_prefix)
        else:
            session = Session(model=self.model, stacks=self.stacks, max_buffer_bytes=self.max_buffer_bytes,
                              module_prefix=self.module_prefix)
        session.backend_note = note
        nested = bool(hooks.thread_sessions())
        self._instruments = Instruments(self.allocator, nested=nested, kernel_times=self.kernel_times,
                                        profiler=backend == "python")
        self._instruments.start()
        # wall clock <-> the session's clock at the start, to place allocator events on our clock
        self._clock = (time_ns(), native.now() if native is not None else perf_counter_ns())
        hooks.activate(session)
        try:
            session.start()
        except Exception as exc:   # a recorder that cannot start warns and records nothing more
            session.fail(exc)
        self._session = session
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        session, self._session = self._session, None
        if session is None:
            return False
        try:
            try:
                session.mark_model_gradients()
            finally:
                session.stream_accesses = self.save_to is not None   # compiled: drain accesses in windows
                session.stop()      # always: removes the compiled recorder's callbacks and memory hook
        finally:
            hooks.deactivate(session)
            try:
                allocator_data = self._instruments.stop()
            except Exception as stop_error:  # e.g. a profiler stopped from another thread than its own
                warnings.warn(f"memlens: allocator events lost ({type(stop_error).__name__}: {stop_error})",
                              RuntimeWarning, stacklevel=2)
                allocator_data = None
        exception = None if exc is None else f"{type(exc).__name__}: {exc}"
        try:
            # the Python recorder's times and the allocator's, onto the clock without its own time
            session.onto_own_clock(allocator_data, self._clock)
            if self.save_to is not None:
                self._save(session, allocator_data, exception)
            else:
                self.trace = self._build(session, allocator_data, exception)
        except Exception as build_error:   # never raise into user code from the recorder itself
            warnings.warn(f"memlens: could not build the trace ({type(build_error).__name__}: {build_error})",
                          RuntimeWarning, stacklevel=2)
            self.trace = None
        finally:
            session.close_windows()
        return False

    def _save(self, session, allocator_data, exception):
        """save_to: write the trace to `save_to` as it is built, its accesses a window of ops at a time
        (`memlens.recording.pipeline.build_trace`); `trace` stays None. When `save_to` cannot be written: to
        `save_fallback` if set, else the trace is built in memory (`trace`) and the error warned about."""
        from memlens.errors import InputError
        from memlens.recording.pipeline import build_trace
        options = {"settings": self._settings(), "clock": self._clock, "exception": exception}
        keep = self._keep_trace
        try:
            built = build_trace(session, allocator_data, save_to=self.save_to, overwrite=self.overwrite,
                                extra_metadata=self.save_metadata, **options)
            self.saved_path, self.saved_summary = built.path, built.summary
        except (OSError, InputError) as exc:
            self.save_error = exc
            if self.save_fallback is None:
                warnings.warn(f"memlens: could not save to {self.save_to} ({exc}); the trace is kept in "
                              "recorder.trace", RuntimeWarning, stacklevel=3)
                keep = True
            else:
                built = build_trace(session, allocator_data, save_to=self.save_fallback, overwrite=True,
                                    extra_metadata=self.save_metadata, **options)
                self.saved_path, self.saved_summary = built.path, built.summary
        if keep:
            self.trace = build_trace(session, allocator_data, **options).trace

    def _build(self, session, allocator_data, exception):
        from memlens.recording.pipeline import build_trace
        return build_trace(session, allocator_data, settings=self._settings(), clock=self._clock,
                           exception=exception).trace

    def _settings(self) -> dict:
        return {"stacks": self.stacks, "allocator": self.allocator,
                "max_buffer_bytes": self.max_buffer_bytes, "module_prefix": self.module_prefix,
                "model": type(self.model).__name__ if self.model is not None else None}

    # ---- decorator --------------------------------------------------------------------------
    def __call__(self, fn):
        """Use as ``@memlens.record(...)``: each call of `fn` is recorded; `.trace` is the last one."""
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        wrapper.recorder = self
        return wrapper


def record(model=None, stacks: bool = False, **options) -> Recorder:
    """Record what PyTorch memory does inside a ``with`` block (or a decorated function).

    Args:
        model: optional `nn.Module`; its parameters and buffers are categorised from the start and its
            submodules named ``model.<path>`` (modules met without it are named by class).
        stacks: also record the Python stack of every op (deduplicated in the `stacks` table; slower).
        allocator: ``"auto"`` (default) joins allocator-level events (CPU: the PyTorch profiler's
            allocation events; CUDA: the caching allocator's memory history) so that temporaries inside
            ops are seen; ``"none"`` records the tensor-level view only (fastest).
        max_buffer_bytes: bound on the recorder's own event memory (default 512 MiB); recording stops
            with a warning when reached, keeping the trace so far.
        module_prefix: name of the root module in paths (default ``"model"``).
        kernel_times: on CUDA, also collect kernel start/end times per op (when CUDA activity is available).
        save_to: save each recording to this ``NAME.memlens`` path as it is built instead of keeping it in
            ``recorder.trace`` (None then; ``recorder.saved_path`` says where it went): the accesses table
            is written a window of ops at a time, so a long recording is saved without ever holding all
            its accesses (the compiled recorder; see `memlens.recording.streamsave` for what is held).
        overwrite: with save_to, replace an existing trace there.

    Returns a `Recorder`; after the block, ``recorder.trace`` is a `memlens.Trace` (times in ns from the
    start of recording, sizes in bytes).
    """
    return Recorder(model, stacks=stacks, **options)


def step() -> None:
    """Mark an iteration boundary in the active recordings; a no-op when nothing is recording."""
    import sys
    session_module = sys.modules.get("memlens.recording.session")
    if session_module is not None and session_module._orphaned_modes:
        session_module.reap_orphaned_modes()
    hooks.step()

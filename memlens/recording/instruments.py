"""Allocator-level instruments run beside the dispatch mode, so that blocks no tensor ever shows
(temporaries inside an op) are seen too.

- CPU (any build): the PyTorch profiler with ``profile_memory=True`` reports every allocator call
  (pointer, signed size, time) from `experimental_event_tree()`.
- CUDA: the caching allocator's memory history (`torch.cuda.memory._record_memory_history`, then
  `_snapshot()`), which also gives segments and streams; kernel times come from the profiler's CUDA
  activity (linked to the launching op by correlation id).
Only one profiler can run at a time: when one is already running (a user's, or an outer recorder's),
the allocator view is skipped and the trace's notes say so. The CUDA memory history is turned on
("all") for the recording and off at its end; a history the user had enabled before is not restored
(PyTorch offers no way to ask for it), and its older entries are left out of the trace.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass, field

import numpy as np
import pandas as pd


# Kineto's profiler is process-wide: two threads enabling it at once crash the process, and
# `torch.autograd._profiler_enabled()` only answers for the calling thread. One recorder at a time
# owns it.
_profiler_lock = threading.Lock()
_profiler_owner: list = []


@dataclass
class AllocatorData:
    """What the instruments saw, on the wall clock (unix ns); `assemble` moves it to trace time."""

    events: object = None      # DataFrame or record.columns.Columns: t_unix_ns, device, addr, delta (+alloc / -free bytes)
    snapshot: dict | None = None            # CUDA memory snapshot (torch.cuda.memory._snapshot())
    kernels: pd.DataFrame | None = None     # launch_unix_ns, start_unix_ns, end_unix_ns (CUDA)
    sources: list = field(default_factory=list)
    notes: list = field(default_factory=list)


def allocation_events_from_tree(roots) -> pd.DataFrame:
    """Every `Allocation` event under the profiler's event tree roots, in one DataFrame.

    Columns: t_unix_ns (int64), device (str), addr (int64), delta (int64 bytes; negative = free).
    """
    import torch
    alloc_type = torch._C._profiler._EventType.Allocation
    t, dev, ptr, delta = [], [], [], []
    stack = list(roots)
    while stack:
        node = stack.pop()
        kind, fields = node.typed
        if kind == alloc_type:
            t.append(node.start_time_ns)
            dev.append(str(fields.device))
            ptr.append(fields.ptr)
            delta.append(fields.alloc_size)
        else:
            stack.extend(node.children)
    df = pd.DataFrame({"t_unix_ns": np.asarray(t, dtype=np.int64), "device": np.asarray(dev, dtype=object),
                       "addr": np.asarray(ptr, dtype=np.int64), "delta": np.asarray(delta, dtype=np.int64)})
    return df.sort_values("t_unix_ns", kind="stable").reset_index(drop=True)


def kernel_events(kineto_events) -> pd.DataFrame:
    """GPU activity (kernels, memcpys, memsets) with the host time of the runtime call that launched it,
    from the profiler's kineto events (`_ProfilerResult.events()`), matched by CUPTI correlation id.

    Columns: name, category ("kernel" | "gpu_memcpy" | "gpu_memset"), launch_unix_ns, start_unix_ns,
    end_unix_ns, correlation. Activity whose launch was not seen is left out.
    """
    from memlens.gpu_activity import LAUNCH_NAMES
    launches, acts = {}, []
    for e in kineto_events:
        name = e.name()
        if str(e.device_type()).endswith(("CUDA", "HIP")):
            category = "gpu_memcpy" if name.startswith("Memcpy") else \
                "gpu_memset" if name.startswith("Memset") else "kernel"
            acts.append((name, category, e.correlation_id(), e.start_ns(), e.start_ns() + e.duration_ns()))
        elif name in LAUNCH_NAMES:
            launches[e.correlation_id()] = e.start_ns()
    rows = [(n, c, launches[k], s, f, k) for n, c, k, s, f in acts if k in launches]
    df = pd.DataFrame(rows, columns=["name", "category", "launch_unix_ns", "start_unix_ns", "end_unix_ns",
                                     "correlation"])
    for col in ("launch_unix_ns", "start_unix_ns", "end_unix_ns", "correlation"):
        df[col] = df[col].astype(np.int64)
    return df


def _start_allocation_profiler(torch, activities: set):
    """Enable the profiler with memory events and (nearly) no op callbacks; returns a function that
    stops it and returns its `_ProfilerResult` (with `experimental_event_tree()` and `events()`)."""
    try:
        from torch._C._profiler import ProfilerConfig, ProfilerState, RecordScope, _ExperimentalConfig
        from torch.autograd import _disable_profiler, _enable_profiler, _prepare_profiler
        config = ProfilerConfig(ProfilerState.KINETO, False, True, False, False, False, _ExperimentalConfig())
        _prepare_profiler(config, activities)
        _enable_profiler(config, activities, {RecordScope.LITE_INTERPRETER})
        return _disable_profiler
    except (ImportError, TypeError, AttributeError):
        prof = torch.profiler.profile(activities=list(activities), profile_memory=True, record_shapes=False)
        prof.__enter__()

        def stop():
            prof.__exit__(None, None, None)
            return prof.profiler.kineto_results
        return stop


@contextlib.contextmanager
def quiet_native_stderr():
    """Silence file descriptor 2 for a moment: Kineto prints `USDT: profiler_start/stop` lines from C++
    on every start and stop, which would be noise in the user's output."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):      # no real fd 2 (embedded interpreters): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class Instruments:
    """Starts and stops the allocator-level instruments for one recording."""

    def __init__(self, mode: str = "auto", *, nested: bool = False, kernel_times: bool = True,
                 profiler: bool = True):
        self.mode = mode
        # False with the compiled recorder: its own memory hook gives the allocation events (the
        # profiler is still started on CUDA for kernel times)
        self.profiler = profiler
        self.nested = nested
        self.kernel_times = kernel_times
        self._profiler = None
        self._cuda_history = False
        self.data = AllocatorData()

    def start(self) -> None:
        if self.mode == "none":
            self.data.notes.append("allocator-level events off (allocator='none'): temporaries inside ops "
                                   "are not seen")
            return
        import torch
        self._start_cuda_history(torch)
        if self.profiler or (self.kernel_times and torch.cuda.is_available()):
            self._start_profiler(torch)

    def _start_profiler(self, torch) -> None:
        """Start the profiler for allocation events only.

        The profiler is enabled with its op callbacks restricted to a scope no server code uses
        (`RecordScope.LITE_INTERPRETER`): allocator calls are still reported (they do not go through
        op callbacks), but ops are not recorded twice (the dispatch mode already records them), which
        makes it nearly free instead of 1.1-1.5x. Falls back to the public `torch.profiler.profile`
        when the private entry points are missing.
        """
        from torch.autograd.profiler import _is_profiler_enabled
        if _is_profiler_enabled or torch.autograd._profiler_enabled():
            why = "an outer memlens recorder" if self.nested else "another profiler"
            self.data.notes.append(f"allocator-level events unavailable: {why} is already profiling this "
                                   "thread (only one profiler can run)")
            return
        with _profiler_lock:
            if _profiler_owner:
                self.data.notes.append("allocator-level events unavailable: a recorder in another thread owns "
                                       "the (process-wide) profiler")
                return
            _profiler_owner.append(self)
        activities = {torch.profiler.ProfilerActivity.CPU}
        if self.kernel_times and torch.cuda.is_available():
            activities.add(torch.profiler.ProfilerActivity.CUDA)
        try:
            with quiet_native_stderr():
                self._profiler = _start_allocation_profiler(torch, activities)
        except Exception as exc:  # a profiler that cannot start must not stop the recording
            self.data.notes.append(f"allocator-level events unavailable: profiler failed to start ({exc})")
            self._release_profiler()

    def _release_profiler(self) -> None:
        with _profiler_lock:
            if self in _profiler_owner:
                _profiler_owner.remove(self)

    def _start_cuda_history(self, torch) -> None:
        if not torch.cuda.is_available():
            return
        try:
            torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                     max_entries=1_000_000)
            self._cuda_history = True
        except Exception as exc:  # e.g. a CUDAPluggableAllocator is installed: no snapshots
            self.data.notes.append(f"CUDA memory history unavailable ({type(exc).__name__}: {exc}); CUDA "
                                   "blocks come from the profiler's allocation events")

    def stop(self) -> AllocatorData:
        """Stop everything started; never raises (problems become notes)."""
        import torch
        if self._cuda_history:
            try:
                self.data.snapshot = torch.cuda.memory._snapshot()
                self.data.sources.append("cuda_snapshot")
            except Exception as exc:
                self.data.notes.append(f"CUDA snapshot failed ({type(exc).__name__}: {exc})")
            finally:
                try:
                    torch.cuda.memory._record_memory_history(enabled=None)
                except Exception as exc:
                    self.data.notes.append(f"could not stop CUDA memory history ({exc})")
        if self._profiler is not None:
            stop, self._profiler = self._profiler, None
            try:
                with quiet_native_stderr():
                    results = stop()
                self.data.events = allocation_events_from_tree(results.experimental_event_tree())
                self.data.sources.append("profiler")
                if torch.cuda.is_available() and self.kernel_times:
                    self.data.kernels = kernel_events(results.events())
            except Exception as exc:
                self.data.notes.append(f"profiler allocation events unavailable ({type(exc).__name__}: {exc})")
            finally:
                self._release_profiler()
        return self.data

"""Where the out-of-core engine's tasks run: Dask's local threaded scheduler, or an existing
``dask.distributed`` cluster given by its scheduler address.

Tasks are plain functions of picklable arguments (paths, numbers) returning small results (counts,
histograms, a few rows), so the driver's memory stays bounded whatever the trace's length; the data moves
between passes through Parquet/npy files in a scratch directory that every worker can read (on a
multi-machine cluster: a shared filesystem).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from memlens.errors import InputError
from memlens.install_hint import extra_install_command


def release_memory() -> None:
    """Hand the memory a finished task freed back to the operating system: glibc keeps freed heap pages
    (one arena per worker thread) and Arrow's allocator keeps its pool, so without this the process's RSS
    is the sum of every task's high-water mark rather than one task's."""
    try:
        import pyarrow
        pyarrow.default_memory_pool().release_unused()
    except Exception:  # an allocator without the call: nothing to release
        pass
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):  # not glibc: its allocator returns memory its own way
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC = None


def run_task(func, *args):
    """One task: ``func(*args)``, then `release_memory` (its garbage freed first)."""
    import gc
    try:
        return func(*args)
    finally:
        gc.collect()
        release_memory()


class Runner:
    """Runs lists of tasks on Dask. `scheduler` is None (local threads, `workers` of them; default the
    CPU count) or the address of a running ``dask.distributed`` scheduler (``tcp://host:8786``)."""

    def __init__(self, scheduler: str | None = None, workers: int | None = None, scratch: str | None = None):
        try:
            import dask  # noqa: F401  (imported here, never at `import memlens`)
        except ImportError:
            raise InputError(f"the dask engine needs dask: {extra_install_command('dask')}") from None
        self.scheduler = scheduler
        self.workers = workers or max(os.cpu_count() or 1, 1)
        self._client = None
        if scheduler:
            try:
                from distributed import Client
            except ImportError:
                raise InputError(f"--scheduler needs dask.distributed: {extra_install_command('dask')}") from None
            try:
                self._client = Client(scheduler, timeout="10s", set_as_default=False)
            except (OSError, TimeoutError, ValueError) as exc:
                raise InputError(f"cannot reach the dask scheduler at {scheduler} ({exc})") from None
        self._scratch_parent = scratch
        self.scratch: Path | None = None

    def map(self, func, arg_lists: list[tuple]) -> list:
        """``[func(*args) for args in arg_lists]``, computed in parallel; results in order."""
        import dask
        if not arg_lists:
            return []
        tasks = [dask.delayed(run_task, pure=False)(func, *args) for args in arg_lists]
        if self._client is not None:
            return list(self._client.gather(self._client.compute(tasks)))
        return list(dask.compute(*tasks, scheduler="threads", num_workers=self.workers))

    def __enter__(self):
        self.scratch = Path(tempfile.mkdtemp(prefix="memlens-ooc-", dir=self._scratch_parent))
        return self

    def __exit__(self, *exc):
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        if self._client is not None:
            self._client.close()
        return False

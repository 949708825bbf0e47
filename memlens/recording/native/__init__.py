"""The compiled recorder (recorder.cpp and the parts it includes), built on first use against the installed torch.

`load()` JIT-builds it with `torch.utils.cpp_extension.load` (g++ and ninja) into a cache directory
keyed by the hash of every source file here, the torch version and the Python version, so it is built
once per machine (`scripts/install.sh` builds it ahead of time). A build says so on stderr (what, where,
about how long) and shows its progress (memlens.buildprogress). `MEMLENS_BUILD_DIR` moves the cache. When
no compiler is present `load()` raises `NativeUnavailable` with the reason; the recorder then falls back
to Python.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import sys
import threading

from memlens.buildcache import cache_root
from memlens.buildlock import LOCK_NAME, build_lock
from memlens.buildprogress import build_progress, needs_build

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE = os.path.join(_HERE, "recorder.cpp")   # the one translation unit: it includes every part (*.h)
BUILD_ESTIMATE = "about 3 min on 2 cores"
_CFLAGS = ["-O2", "-DNDEBUG"]   # NDEBUG as torch was built: RecordFunction's layout depends on it
_lock = threading.Lock()
_module = None
_error: str | None = None


class NativeUnavailable(RuntimeError):
    """The compiled recorder could not be built or loaded (the message says why)."""


def sources() -> list[str]:
    """Every file the build compiles: recorder.cpp and the parts it includes (all *.h here), sorted."""
    return [_SOURCE, *sorted(glob.glob(os.path.join(_HERE, "*.h")))]


def build_dir() -> str:
    """Where the compiled recorder is cached (created on demand)."""
    import torch
    sha = hashlib.sha256()
    for path in sources():
        sha.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            sha.update(f.read())
    digest = hashlib.sha256(sha.digest() + repr(_CFLAGS).encode()).hexdigest()[:12]
    tag = f"torch{torch.__version__.replace('+', '_')}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}"
    return os.path.join(cache_root(), tag)


def load(verbose: bool = False):
    """The compiled extension module (built on the first call in a machine, then loaded from cache)."""
    global _module, _error
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        if _error is not None:
            raise NativeUnavailable(_error)
        compiler = os.environ.get("CXX") or "c++"
        if shutil.which(compiler) is None and shutil.which("g++") is None:
            _error = f"no C++ compiler found ({compiler!r} / 'g++' not on PATH)"
            raise NativeUnavailable(_error)
        if shutil.which("ninja") is None:      # the pip `ninja` package, in a venv that is not activated
            try:
                import ninja
                os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
            except ImportError:
                pass
        try:
            path = build_dir()
            library = os.path.join(path, "memlens_recorder.so")
            _module = _load_built(path, library)
            if _module is not None:
                return _module
            from torch.utils.cpp_extension import load as _load
            # one build at a time, no stale lock of a killed build, nothing half-built after Ctrl-C
            with build_lock(path, "the compiled recorder", library=library):
                build = (build_progress("the compiled recorder", path, [_SOURCE], len(sources()) - 1,
                                        BUILD_ESTIMATE)
                         if needs_build(library, sources()) else contextlib.nullcontext())
                with build:   # a build never runs silently: what, where, how long so far
                    _module = _load(name="memlens_recorder", sources=[_SOURCE], build_directory=path,
                                    extra_cflags=_CFLAGS, verbose=verbose)
                _mark_built(path, library)
        except Exception as exc:   # a missing ninja, a compile error, a failed import: say so once
            _error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc}"
            raise NativeUnavailable(_error) from exc
        return _module


BUILT_MARK = "memlens-built"      # written in the build folder once its library was built and loaded


def _load_built(path: str, library: str):
    """The library of a finished build in `path`, imported directly (None when there is none, or another
    process holds the build lock now). The folder is named by the hash of the sources, flags, torch and
    Python, so a library that was built and loaded there once is the right one: no need to import
    `torch.utils.cpp_extension` (setuptools, ~0.25 s) and run ninja at each process's first recording (nor
    to rebuild when the same sources are met at another path, which changes torch's ninja file)."""
    import fcntl
    import importlib.util
    mark = os.path.join(path, BUILT_MARK)
    try:
        with open(mark) as f:
            if f.read().strip() != os.path.basename(library) or not os.path.exists(library):
                return None
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None
    try:
        try:   # shared: no build (which takes it exclusively) can be rewriting the library meanwhile
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return None
        spec = importlib.util.spec_from_file_location("memlens_recorder", library)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except Exception:   # a library that does not import here: torch's loader rebuilds or says why
        return None
    finally:
        os.close(fd)


def _mark_built(path: str, library: str) -> None:
    """Say (atomically) that `library` in `path` is a finished build (see `_load_built`)."""
    tmp = os.path.join(path, f"{BUILT_MARK}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(os.path.basename(library) + "\n")
        os.replace(tmp, os.path.join(path, BUILT_MARK))
    except OSError:   # a read-only cache: the next process goes through torch's loader, as before
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def available() -> bool:
    """True when the compiled recorder builds and loads here."""
    try:
        load()
        return True
    except NativeUnavailable:
        return False

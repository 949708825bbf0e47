"""The compiled snapshot-pickle walker (stream_walk.cpp), built on first use.

Unlike the compiled recorder it uses only the CPython API, so it is compiled with the C++ compiler and
Python's own include directory (``c++ -shared``), not `torch.utils.cpp_extension`: importing torch to
load it would cost more than the walk saves. The build is cached in a directory keyed by the source's
hash and the Python version (``$MEMLENS_BUILD_DIR`` or ``~/.cache/memlens``), written atomically, so it
happens once per machine. `load()` raises `NativeUnavailable` with the reason when it cannot be built;
the reader then uses the Python walker, which gives the same decisions and the same results.

``MEMLENS_PICKLE_WALKER=python`` selects the Python walker (``compiled``, the default, falls back to it).
``MEMLENS_WALKER_SANITIZE=1`` builds it with AddressSanitizer and UBSan (a separate cache entry; load it with
``LD_PRELOAD=$(c++ -print-file-name=libasan.so)``): for the fuzz runs of tests/fuzz_walker.py.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading

from memlens.buildcache import cache_root

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE = os.path.join(_HERE, "stream_walk.cpp")
# included by stream_walk.cpp (one translation unit): part of the cache key
_HEADERS = [os.path.join(_HERE, name) for name in ("keyed_hash.h", "frame_table.h", "read_slots.h", "walk.h")]
_NAME = "memlens_stream_walk"
_CFLAGS = ["-O2", "-std=c++17", "-fPIC", "-shared"]
_lock = threading.Lock()
_module = None
_error: str | None = None


class NativeUnavailable(RuntimeError):
    """The compiled walker could not be built or loaded (the message says why)."""


def walker() -> str:
    """"compiled" or "python", from ``$MEMLENS_PICKLE_WALKER`` (default "compiled")."""
    name = (os.environ.get("MEMLENS_PICKLE_WALKER") or "compiled").strip().lower()
    return "python" if name == "python" else "compiled"


_SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g"]


def _flags() -> list[str]:
    return _CFLAGS + (_SANITIZE if os.environ.get("MEMLENS_WALKER_SANITIZE") == "1" else [])


def _library_path() -> str:
    sha = hashlib.sha256()
    for source in [_SOURCE, *_HEADERS]:
        with open(source, "rb") as f:
            sha.update(f.read())
    digest = hashlib.sha256(sha.digest() + repr(_flags()).encode()).hexdigest()[:12]
    tag = f"stream_walk-{sys.implementation.cache_tag}-{digest}"
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return os.path.join(cache_root(), tag, _NAME + suffix)


def _build(path: str) -> None:
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None:
        compiler = "g++"
        if shutil.which(compiler) is None:
            raise NativeUnavailable("no C++ compiler found ('c++' / 'g++' not on PATH)")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".so.tmp")
    os.close(fd)
    try:
        cmd = [compiler, *_flags(), "-I", sysconfig.get_paths()["include"], _SOURCE, "-o", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise NativeUnavailable(f"compiling stream_walk.cpp failed: {tail}")
        os.replace(tmp, path)  # atomic: a concurrent build or load never sees half a library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load():
    """The compiled walker module (built on the first call in a machine, then loaded from cache)."""
    global _module, _error
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        if _error is not None:
            raise NativeUnavailable(_error)
        try:
            path = _library_path()
            if not os.path.exists(path):
                from memlens.buildlock import build_lock
                with build_lock(os.path.dirname(path), "the compiled snapshot walker", library=path):
                    if not os.path.exists(path):  # not built meanwhile by the process we waited for
                        _build(path)
            loader = importlib.machinery.ExtensionFileLoader(_NAME, path)
            spec = importlib.util.spec_from_file_location(_NAME, path, loader=loader)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            _module = module
        except NativeUnavailable as exc:
            _error = str(exc)
            raise
        except Exception as exc:  # an unloadable library, an unwritable cache: say so once
            _error = f"{type(exc).__name__}: {exc}"
            raise NativeUnavailable(_error) from exc
        return _module


def available() -> bool:
    """True when the compiled walker builds and loads here."""
    try:
        load()
        return True
    except NativeUnavailable:
        return False

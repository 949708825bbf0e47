"""The fake-CUDA shim: a small C++ extension that lets a CPU-only torch run training steps on fake `cuda`.

Fake tensors carry a CUDA device but own no memory. A CPU build of torch still needs two pieces of glue
for them (see csrc/fake_cuda.cpp): a CUDA device guard (autograd's engine switches devices around every
backward function; without one the process aborts) and CUDA hooks that report one device (so the engine
starts its CUDA worker thread, as a real run does). torch creates its CUDA hooks object once, at first use,
so the shim must be in the process before torch initialises:

- `import memlens` before `import torch` arranges that: memlens watches for the torch import and loads
  the shim (already built) just before torch's own libraries initialise;
- where torch came first, `memlens.predict` says so and names the CLI route,
  ``memlens predict -- python train.py``, which loads the shim before running the script.

On a CUDA build of torch the shim is never needed (real CUDA hooks exist) and never loaded. The shim is
built once per torch version with torch.utils.cpp_extension (about 30 s on two cores), in a separate
process so that building it never initialises torch in the caller.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

from memlens.errors import MemlensError

EXTENSION_NAME = "memlens_fake_cuda"
SOURCE = Path(__file__).with_name("csrc") / "fake_cuda.cpp"

_state = {"preloaded": False, "module": None, "error": None, "probing": False}


class ShimError(MemlensError):
    """The fake-CUDA shim cannot be built or is not in effect (the message says what to do)."""


def _torch_dir() -> Path | None:
    if "torch" in sys.modules:
        return Path(sys.modules["torch"].__file__).parent
    _state["probing"] = True      # our own look-up must not look like the torch import to the watcher
    try:
        spec = importlib.util.find_spec("torch")
    finally:
        _state["probing"] = False
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def _torch_version() -> str:
    import importlib.metadata  # here, not at module level: `import memlens` loads this module
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_dir() -> Path:
    """Where the shim is built: one folder per (torch version, source digest), under the user's cache."""
    import hashlib
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    root = Path(os.environ.get("MEMLENS_CACHE", Path.home() / ".cache" / "memlens"))
    return root / "ext" / f"{EXTENSION_NAME}-torch{_torch_version()}-{digest}"


def library_path() -> Path:
    """The built shared library (it may not exist yet)."""
    return build_dir() / f"{EXTENSION_NAME}.so"


def is_built() -> bool:
    return library_path().exists()


def torch_has_cuda_build() -> bool:
    """True for a CUDA (or ROCm) build of torch, which has real CUDA hooks and needs no shim."""
    torch_dir = _torch_dir()
    if torch_dir is None:
        return False
    lib = torch_dir / "lib"
    return any(lib.glob("libtorch_cuda*.so")) or any(lib.glob("libtorch_hip*.so"))


def build(verbose: bool = False) -> Path:
    """Build the shim (if not built yet) in a child process; returns the library path.

    A child process, because importing torch.utils.cpp_extension here would initialise torch before the
    shim could be loaded. Raises `ShimError` with the compiler's last lines when it fails.
    """
    path = library_path()
    if path.exists():
        return path
    out = build_dir()
    code = ("import sys; from torch.utils.cpp_extension import load; "
            f"load({EXTENSION_NAME!r}, [sys.argv[1]], build_directory=sys.argv[2], verbose={bool(verbose)}, "
            "extra_cflags=['-O2'])")
    from memlens.buildlock import BuildBusy, build_lock
    try:
        # one build at a time, no stale lock of a killed build, nothing half-built after Ctrl-C
        with build_lock(out, "the fake-CUDA shim", library=path):
            if path.exists():  # built by the process we waited for
                return path
            import subprocess
            proc = subprocess.run([sys.executable, "-c", code, str(SOURCE), str(out)], capture_output=True,
                                  text=True)
    except BuildBusy as exc:
        raise ShimError(str(exc)) from None
    if proc.returncode != 0 or not path.exists():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise ShimError(f"could not build the fake-CUDA shim in {out} (needs a C++ compiler and torch's "
                        f"headers):\n{tail}")
    return path


def prepare() -> None:
    """Build the shim now if it is needed and missing and torch is not imported yet, so that the import
    watcher can load it when torch comes (the first prediction in a fresh environment then just works)."""
    if "torch" not in sys.modules and not torch_has_cuda_build() and not is_built():
        build()


def preload() -> bool:
    """Load the built shim before torch initialises (called when torch is about to be imported).

    Loads torch's core libraries and the shim with RTLD_GLOBAL; the shim's static initialiser registers
    the fake CUDA guard and hooks. Returns True when loaded. Never raises: a failure is kept and reported
    by `require`.
    """
    if _state["preloaded"]:
        return True
    try:
        if "torch" in sys.modules or torch_has_cuda_build() or not is_built():
            return False
        import ctypes
        lib = _torch_dir() / "lib"
        for name in ("libc10.so", "libtorch_cpu.so"):
            ctypes.CDLL(str(lib / name), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(library_path()), mode=ctypes.RTLD_GLOBAL)
        _state["preloaded"] = True
        return True
    except OSError as exc:
        _state["error"] = f"{type(exc).__name__}: {exc}"
        return False


def _module():
    """The shim as a Python module (same library as the preloaded one: the loader reuses it)."""
    if _state["module"] is None:
        spec = importlib.util.spec_from_file_location(EXTENSION_NAME, library_path())
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _state["module"] = module
    return _state["module"]


def status() -> dict:
    """What is in effect: ``{"needed", "built", "preloaded", "hooks_active", "guard_active"}``."""
    needed = not torch_has_cuda_build()
    info = {"needed": needed, "built": is_built(), "preloaded": _state["preloaded"],
            "hooks_active": False, "guard_active": False, "error": _state["error"]}
    if needed and info["built"] and "torch" in sys.modules:
        try:
            m = _module()
            info["hooks_active"], info["guard_active"] = bool(m.hooks_active()), bool(m.guard_active())
        except Exception as exc:  # a stale or broken build: report, do not crash
            info["error"] = f"{type(exc).__name__}: {exc}"
    return info


CLI_ROUTE = "memlens predict --gpu H100 -- python your_script.py"


def require() -> None:
    """Make sure fake `cuda` training steps can run in this process, or raise `ShimError` saying how.

    On a CUDA build nothing is needed. On a CPU build: builds the shim when missing; if torch was imported
    before memlens (so its CPU-only CUDA hooks are fixed for the life of the process), raises with the
    two ways out.
    """
    if torch_has_cuda_build():
        return
    torch_first = "torch" in sys.modules and not _state["preloaded"]
    built_now = not is_built()
    if built_now:
        build()
    if torch_first and built_now:
        raise ShimError(
            "memlens built its fake-CUDA shim just now (once per torch version, into "
            f"{build_dir()}); it takes effect in the next process that imports memlens before torch, or "
            f"under `{CLI_ROUTE}`")
    if torch_first:
        # the device guard can still be added now; the hooks cannot, so check what torch uses
        m = _module()
        if m.install():
            return
        raise ShimError(
            "this CPU-only torch was imported before memlens, so memlens could not install its fake-CUDA "
            "shim (torch fixes its CUDA hooks when it initialises). Import memlens before torch "
            f"(`import memlens` as the first import), or run the script under prediction: `{CLI_ROUTE}`")
    if not status()["hooks_active"]:
        raise ShimError(f"the fake-CUDA shim is loaded but torch does not use it ({_state['error'] or 'unknown'}); "
                        f"run the script under prediction instead: `{CLI_ROUTE}`")


def set_enabled(on: bool) -> None:
    """Let the shim's hooks report the fake device (inside a prediction) or not (outside: a CPU-only torch
    then looks exactly as without the shim). A no-op where the shim is not in use."""
    if torch_has_cuda_build() or not is_built() or "torch" not in sys.modules:
        return
    try:
        _module().set_enabled(bool(on))
    except Exception:   # an older build without the switch: it always reports the device
        pass


class _TorchImportWatcher(importlib.abc.MetaPathFinder):
    """Loads the shim the moment `import torch` starts (only when memlens was imported first)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch" and not _state["probing"]:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
            preload()
        return None


def watch_torch_import() -> None:
    """Arrange for the shim to load before torch initialises (called by ``import memlens``).

    Cheap: no torch import, no file I/O beyond one stat when torch is imported later. Disabled with
    MEMLENS_NO_SHIM=1.
    """
    if os.environ.get("MEMLENS_NO_SHIM") == "1" or "torch" in sys.modules:
        return
    if not any(isinstance(f, _TorchImportWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchImportWatcher())

"""The fake-CUDA shim: a small C++ extension that lets a CPU-only torch run training steps on fake `cuda`.

Fake tensors carry a CUDA device but own no memory. A CPU build of torch still needs two pieces of glue
for them (see csrc/fake_cuda.cpp): a CUDA device guard (autograd's engine switches devices around every
backward function; without one the process aborts) and CUDA hooks that report one device (so the engine
starts its CUDA worker thread, as a real run does). torch creates its CUDA hooks object once, during
``import torch`` itself (torch._C's initialisation asks for it), and keeps it for the life of the process:

- `import memlens` before `import torch`: memlens watches for the torch import and loads the shim just
  before torch's own libraries initialise (building it there first when it is missing, once per torch
  version, in a child process), so torch creates the shim's hooks;
- torch imported first: torch already holds its CPU-only hooks object, which has no state of its own; the
  shim re-makes that object in place as its own hooks (`require`), so the prediction runs in this process
  all the same. What cannot be undone is a backward pass that ran before the shim's device guard was there:
  autograd's engine counts its device threads once, at the first backward. `memlens.prediction.firstuse`
  finds that case and runs the prediction in a child process instead.

On a CUDA build of torch the shim is never needed (real CUDA hooks exist) and never loaded. The shim is
built once per torch version with torch.utils.cpp_extension (30 s to 2 min on two cores), in a separate
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

FAILED_MARK = "build-failed.txt"     # in the build folder: the last build's compiler output, when it failed

_state = {"preloaded": False, "module": None, "error": None, "probing": False, "torch_first": False}


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
    """Where the shim is built: one folder per (torch version, source digest), under memlens's build cache
    (`memlens.buildcache.cache_root`: ``$MEMLENS_BUILD_DIR`` moves it with the other compiled parts)."""
    import hashlib

    from memlens.buildcache import cache_root
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return Path(cache_root()) / "ext" / f"{EXTENSION_NAME}-torch{_torch_version()}-{digest}"


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
    (out / FAILED_MARK).unlink(missing_ok=True)
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
        try:    # the import watcher does not try again in every process; `build()` itself always does
            (out / FAILED_MARK).write_text(tail + "\n")
        except OSError:
            pass
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
        if "torch" in sys.modules or torch_has_cuda_build():
            return False
        if not is_built() and not _build_before_torch():
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


def _build_before_torch() -> bool:
    """Build the missing shim as torch is first imported (memlens imported first), so that the first
    prediction works in this process; says so on stderr, since the import then takes tens of seconds once.
    False (nothing raised: ``import torch`` must not fail for memlens) when it cannot be built; `require`
    reports why. A build that failed before is not retried here."""
    if (build_dir() / FAILED_MARK).exists():
        return False
    print(f"memlens: building its fake-CUDA shim for memlens.predict, once per torch version (up to a few minutes), "
          f"into {build_dir()}", file=sys.stderr, flush=True)
    try:
        build()
    except ShimError as exc:
        _state["error"] = str(exc)
        return False
    return True


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

    On a CUDA build nothing is needed. On a CPU build: builds the shim when missing (normally done already
    when torch was imported after memlens: `preload`); if torch was imported before memlens, takes over
    torch's CPU-only CUDA hooks object (see the module docstring) and raises when that is not possible.
    """
    if torch_has_cuda_build():
        return
    torch_first = "torch" in sys.modules and not _state["preloaded"]
    if not is_built():
        build()
    if torch_first:
        _state["torch_first"] = True
        if _module().install():   # registers the guard and takes over torch's hooks object
            return
        raise ShimError(
            "this torch was imported before memlens and its CUDA hooks are not the plain CPU-only ones, so "
            "memlens could not install its fake-CUDA shim. Import memlens before torch (`import memlens` as the "
            f"first import), or run the script under prediction: `{CLI_ROUTE}`")
    if not status()["hooks_active"]:
        raise ShimError(f"the fake-CUDA shim is loaded but torch does not use it ({_state['error'] or 'unknown'}); "
                        f"run the script under prediction instead: `{CLI_ROUTE}`")


def loaded_after_torch() -> bool:
    """True when the shim came into this process after torch (torch imported before memlens)."""
    return bool(_state.get("torch_first")) or ("torch" in sys.modules and not _state["preloaded"])


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


def _install_after_torch() -> None:
    """torch came first: put the built shim in now (device guard registered, torch's hooks taken over, reporting
    no device until a prediction starts), so that a backward the caller runs before predicting already finds
    the guard (autograd's engine counts its devices at the first backward). Never raises: `require` reports."""
    try:
        if not torch_has_cuda_build() and is_built():
            _state["torch_first"] = True
            _module().install()
    except Exception as exc:   # `import memlens` must not fail for the shim
        _state["error"] = f"{type(exc).__name__}: {exc}"


def watch_torch_import() -> None:
    """Arrange for the shim to load before torch initialises (called by ``import memlens``).

    Cheap: no torch import, no file I/O beyond one stat when torch is imported later. Where torch is imported
    already, loads the built shim now (`_install_after_torch`). Disabled with MEMLENS_NO_SHIM=1.
    """
    if os.environ.get("MEMLENS_NO_SHIM") == "1":
        return
    if "torch" in sys.modules:
        _install_after_torch()
        return
    if not any(isinstance(f, _TorchImportWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchImportWatcher())

"""Building the compiled recorder: every part is compiled and keys the cache, and a build is never silent.

The build itself is replaced by a fake (torch.utils.cpp_extension.load) that writes what ninja would
(an object file, then the library) over a fraction of a second, so these tests need no compiler.
"""
from __future__ import annotations

import glob
import os
import re
import time

import pytest

torch = pytest.importorskip("torch")
import torch.utils.cpp_extension as cpp  # noqa: E402

from memlens import buildprogress  # noqa: E402
from memlens.recording import native  # noqa: E402

NATIVE_DIR = os.path.dirname(native.__file__)


def test_every_part_recorder_cpp_includes_is_a_source_and_nothing_else():
    with open(os.path.join(NATIVE_DIR, "recorder.cpp")) as f:
        included = re.findall(r'^#include "([^"]+)"', f.read(), flags=re.M)
    parts = sorted(os.path.basename(p) for p in glob.glob(os.path.join(NATIVE_DIR, "*.h")))
    assert sorted(included) == parts and len(parts) == 14
    assert [os.path.basename(p) for p in native.sources()] == ["recorder.cpp", *parts]


def test_each_part_keys_the_cache(monkeypatch, tmp_path):
    """Changing any part (a header too) gives another build folder."""
    monkeypatch.setenv("MEMLENS_BUILD_DIR", str(tmp_path))
    real = native.sources()
    first = native.build_dir()
    copies = []
    for i, path in enumerate(real):
        copy = tmp_path / f"src{i}" / os.path.basename(path)
        copy.parent.mkdir()
        copy.write_bytes(open(path, "rb").read())
        copies.append(str(copy))
    monkeypatch.setattr(native, "sources", lambda: copies)
    assert native.build_dir() == first           # same bytes, same names: the same folder
    folders = {first}
    for copy in copies:
        original = open(copy, "rb").read()
        with open(copy, "ab") as f:
            f.write(b"\n// changed\n")
        folders.add(native.build_dir())
        open(copy, "wb").write(original)
    assert len(folders) == len(copies) + 1


def _fake_torch_build(calls, seconds=0.3, fail=False):
    def load(name, sources, build_directory, **kwargs):
        calls.append(build_directory)
        time.sleep(seconds / 2)
        open(os.path.join(build_directory, "recorder.o"), "w").close()
        time.sleep(seconds / 2)
        if fail:
            raise RuntimeError("Error building extension 'memlens_recorder'")
        open(os.path.join(build_directory, "memlens_recorder.so"), "w").close()
        return "the module"
    return load


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMLENS_BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_error", None)
    monkeypatch.setattr(native.shutil, "which", lambda name: "/usr/bin/" + name)   # no compiler needed
    monkeypatch.setattr(buildprogress, "TICK_S", 0.05)
    return tmp_path


def test_first_build_says_what_where_and_how_far(fresh, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(cpp, "load", _fake_torch_build(calls))
    assert native.load() == "the module"
    folder = native.build_dir()
    assert calls == [folder]
    lines = capsys.readouterr().err.splitlines()
    n_headers = len(glob.glob(os.path.join(NATIVE_DIR, "*.h")))   # the parts recorder.cpp includes
    assert n_headers >= 10
    assert lines[0] == (f"memlens: building the compiled recorder (C++: 1 translation unit, recorder.cpp with "
                        f"{n_headers} headers; about 3 min on 2 cores) in {folder} ...")
    ticks = lines[1:-1]
    assert ticks and all(re.fullmatch(r"memlens:   \.\.\. 0:00 elapsed, step (1 of 2: compiling recorder\.cpp|"
                                      r"2 of 2: linking)", t) for t in ticks), ticks
    assert ticks[0].endswith("step 1 of 2: compiling recorder.cpp")   # the object file comes half way through
    assert ticks[-1].endswith("step 2 of 2: linking")
    assert lines[-1] == "memlens: built the compiled recorder in 0:00"


def test_loading_a_built_recorder_says_nothing(fresh, monkeypatch, capsys):
    folder = native.build_dir()
    os.makedirs(folder)
    library = os.path.join(folder, "memlens_recorder.so")
    open(library, "w").close()
    newest = max(os.stat(p).st_mtime for p in native.sources())
    os.utime(library, (newest + 10, newest + 10))
    monkeypatch.setattr(cpp, "load", lambda **kwargs: "the module")
    assert native.load() == "the module"
    assert capsys.readouterr().err == ""


def test_a_source_newer_than_the_library_is_a_build(tmp_path):
    src, lib = tmp_path / "a.h", tmp_path / "x.so"
    src.write_text("x")
    assert buildprogress.needs_build(lib, [src])              # no library yet
    lib.write_text("")
    os.utime(src, (1000, 1000))
    os.utime(lib, (2000, 2000))
    assert not buildprogress.needs_build(lib, [src])
    os.utime(src, (3000, 3000))
    assert buildprogress.needs_build(lib, [src])


def test_a_failed_build_says_so_and_falls_back(fresh, monkeypatch, capsys):
    monkeypatch.setattr(cpp, "load", _fake_torch_build([], seconds=0.1, fail=True))
    with pytest.raises(native.NativeUnavailable, match="Error building extension"):
        native.load()
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("memlens: building the compiled recorder (C++: 1 translation unit, ")
    assert err[-1] == "memlens: building the compiled recorder failed after 0:00"


def test_steps_count_each_unit_then_the_link(tmp_path):
    units = [str(tmp_path / "a.cpp"), str(tmp_path / "sub" / "b.cpp")]
    assert buildprogress._step(str(tmp_path), units) == "step 1 of 3: compiling a.cpp"
    (tmp_path / "a.o").write_text("")
    assert buildprogress._step(str(tmp_path), units) == "step 2 of 3: compiling b.cpp"
    (tmp_path / "b.o").write_text("")
    assert buildprogress._step(str(tmp_path), units) == "step 3 of 3: linking"
    assert buildprogress._step(str(tmp_path), []) == "step 1 of 1: linking"


def test_clock_reads_minutes_and_seconds():
    assert [buildprogress._clock(s) for s in (0, 9.9, 61, 185, 3600)] == ["0:00", "0:09", "1:01", "3:05", "60:00"]


def test_a_finished_build_is_loaded_directly(fresh, monkeypatch):
    """After a build the folder is marked; the next process imports the library itself (no torch loader,
    no ninja)."""
    calls = []
    monkeypatch.setattr(cpp, "load", _fake_torch_build(calls, seconds=0.02))
    assert native.load() == "the module"
    folder = native.build_dir()
    with open(os.path.join(folder, native.BUILT_MARK)) as f:
        assert f.read() == "memlens_recorder.so\n"
    imported = []

    class Loader:
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            imported.append(module.__name__)
    import importlib.util
    monkeypatch.setattr(importlib.util, "spec_from_file_location",
                        lambda name, path: importlib.machinery.ModuleSpec(name, Loader(), origin=path))
    monkeypatch.setattr(native, "_module", None)
    module = native.load()
    assert imported == ["memlens_recorder"] and module.__name__ == "memlens_recorder" and calls == [folder]


def test_a_failed_build_leaves_no_mark(fresh, monkeypatch):
    monkeypatch.setattr(cpp, "load", _fake_torch_build([], seconds=0.02, fail=True))
    with pytest.raises(native.NativeUnavailable):
        native.load()
    assert not os.path.exists(os.path.join(native.build_dir(), native.BUILT_MARK))


def test_no_direct_load_without_the_mark_or_while_a_build_holds_the_lock(fresh, monkeypatch):
    import fcntl
    folder = native.build_dir()
    os.makedirs(folder)
    library = os.path.join(folder, "memlens_recorder.so")
    open(library, "w").close()
    assert native._load_built(folder, library) is None                 # built, but never marked
    native._mark_built(folder, library)
    fd = os.open(os.path.join(folder, "memlens-build.lock"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)       # a build in progress (another process's, in real life)
        assert native._load_built(folder, library) is None
    finally:
        os.close(fd)
    os.unlink(library)
    assert native._load_built(folder, library) is None                 # marked, but the library is gone


def test_a_fresh_process_records_without_torchs_extension_loader():
    """The process's first recording loads the built recorder without importing torch.utils.cpp_extension."""
    import subprocess
    import sys
    if not native.available():
        pytest.skip("compiled recorder does not build here")
    code = ("import sys, torch, memlens\n"
            "m = torch.nn.Linear(4, 4)\n"
            "with memlens.record(m, backend='compiled') as r:\n"
            "    m(torch.randn(2, 4))\n"
            "print(r.trace.metadata['recorder'], 'torch.utils.cpp_extension' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["compiled", "False"]

"""Issue 26 item 6: a killed build of a compiled extension never blocks later builds; a waiting process says
what it waits for and gives up after a bound; an interrupted build leaves nothing behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from memlens.buildlock import LOCK_NAME, BuildBusy, build_lock

HOLD = textwrap.dedent("""
    import sys, time
    from memlens.buildlock import build_lock
    with build_lock(sys.argv[1], "a test extension"):
        open(sys.argv[1] + "/lock", "w").close()  # what torch's FileBaton holds during its build
        print("holding", flush=True)
        time.sleep(120)
""")


def _holder(folder):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), *sys.path]))
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "holding"
    return proc


def test_stale_lock_of_a_killed_build_is_removed(tmp_path):
    proc = _holder(tmp_path)
    proc.send_signal(signal.SIGKILL)  # an OOM kill: no cleanup ran, torch's lock stays
    proc.wait()
    assert (tmp_path / "lock").exists()
    start = time.monotonic()
    with build_lock(tmp_path, "a test extension", wait_s=60):
        assert not (tmp_path / "lock").exists()
    assert time.monotonic() - start < 30  # taken at once (generous bound: a loaded machine)


def test_a_waiting_build_says_what_it_waits_for_and_gives_up(tmp_path, capsys):
    proc = _holder(tmp_path)
    try:
        with pytest.raises(BuildBusy) as exc:
            with build_lock(tmp_path, "a test extension", wait_s=1.0, poll_s=0.05):
                pass
        assert f"process {proc.pid}" in str(exc.value) and "MEMLENS_BUILD_WAIT_S" in str(exc.value)
        assert f"waiting for process {proc.pid} to finish building a test extension" in capsys.readouterr().err
        assert (tmp_path / "lock").exists()  # a live build's lock is left alone
    finally:
        proc.kill()
        proc.wait()


def test_interrupted_build_leaves_nothing_behind(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with build_lock(tmp_path, "a test extension", library=tmp_path / "ext.so"):
            for name in ("lock", "ext.o", "build.ninja", ".ninja_log", "ext.so"):
                (tmp_path / name).write_text("partial")
            raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]


def test_interrupt_keeps_a_complete_build(tmp_path):
    (tmp_path / "ext.so").write_text("built before")
    (tmp_path / "ext.o").write_text("built before")
    with pytest.raises(KeyboardInterrupt):
        with build_lock(tmp_path, "a test extension", library=tmp_path / "ext.so"):
            (tmp_path / "lock").write_text("")
            raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LOCK_NAME, "ext.so", "ext.o"])


def test_recorder_build_removes_the_stale_torch_lock(tmp_path, monkeypatch):
    """The recorder's load() takes the lock around torch's build: a stale ``lock`` (which would make
    torch's FileBaton wait forever) is gone before torch looks."""
    pytest.importorskip("torch")
    import torch.utils.cpp_extension as cpp

    from memlens.recording import native
    monkeypatch.setenv("MEMLENS_BUILD_DIR", str(tmp_path))
    folder = native.build_dir()
    os.makedirs(folder)
    open(os.path.join(folder, "lock"), "w").close()
    seen = []

    def fake_load(name, sources, build_directory, **kwargs):
        seen.append(os.path.exists(os.path.join(build_directory, "lock")))
        return "module"

    monkeypatch.setattr(cpp, "load", fake_load)
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_error", None)
    assert native.load() == "module" and seen == [False]

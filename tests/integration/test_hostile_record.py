"""Issue 18, items 8, 10 and 11: nothing a user recorded is lost: `memlens record` checks its output
first and saves on Ctrl-C / SIGTERM; jagged nested tensors and exits from another thread keep the trace."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import memlens
from hostile import ROOT, assert_refused, run_memlens
from memlens.trace.read import load_trace

SCRIPT = textwrap.dedent("""
    import sys, time, torch
    kept = [torch.ones(1000 + i) for i in range(5)]   # 5 blocks of 4,000.. bytes, live at the interrupt
    y = kept[0] * 2
    print("ready", flush=True)
    if sys.argv[1] == "sleep":
        time.sleep(60)
    sys.exit(int(sys.argv[2]))
""")


def _start_record(tmp_path, out, mode="sleep", code=0):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # SIGINT at its default in the child whatever pytest inherited: a shell starts background jobs with SIGINT
    # ignored, and Python keeps an ignored SIGINT ignored (Ctrl-C would never reach such a recording)
    return subprocess.Popen([sys.executable, "-m", "memlens", "record", "-o", str(out), "--allocator", "none",
                             "--", "python", str(script), mode, str(code)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_saves_what_was_recorded(tmp_path, sig, status):
    out = tmp_path / "run.memlens"
    proc = _start_record(tmp_path, out)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    trace = load_trace(out)
    assert trace.metadata["interrupted"] == signal.Signals(sig).name
    sizes = set(trace.blocks["size"].tolist())
    assert {4 * (1000 + i) for i in range(5)} <= sizes, sorted(sizes)
    assert any("interrupted" in note for note in trace.metadata["notes"])


def test_script_exit_status_is_ours_and_trace_saved(tmp_path):
    out = tmp_path / "exit.memlens"
    proc = _start_record(tmp_path, out, mode="exit", code=3)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert "interrupted" not in load_trace(out).metadata


def test_unwritable_output_is_refused_before_the_script_runs(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    outcome = run_memlens("record", "-o", blocker / "sub" / "out.memlens", "--", "python", script)
    assert_refused(outcome, "out.memlens")
    assert not marker.exists()


def test_output_that_is_not_a_trace_is_refused_before_the_script_runs(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data.txt").write_text("keep me")
    assert_refused(run_memlens("record", "--force", "-o", precious, "--", "python", script), "is a directory")
    assert not marker.exists()
    assert (precious / "data.txt").read_text() == "keep me"


# ---------------------------------------------------------------- 10. nested tensors

@pytest.mark.parametrize("backend", ["python", "compiled"])
def test_jagged_nested_tensor_keeps_recording(monkeypatch, backend):
    monkeypatch.setenv("MEMLENS_RECORDER", backend)
    nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)
    with memlens.record(allocator="none") as rec:
        doubled = nt * 2
        after = torch.ones(256) + 1   # an ordinary op after the nested ones must still be recorded
    trace = rec.trace
    assert trace is not None
    assert "stop_reason" not in trace.metadata or not trace.metadata["stop_reason"], trace.metadata
    sizes = set(trace.blocks["size"].tolist())
    assert 1024 in sizes  # the ordinary output: 256 float32
    assert len(trace.accesses) > 0
    if backend == "python":
        # the Python recorder counts the wrapper tensors it cannot map to a block, and says so
        assert any("had no storage" in note for note in trace.metadata["notes"]), trace.metadata["notes"]
    del doubled, after


# ---------------------------------------------------------------- 11. exit from another thread

def test_exit_from_another_thread_neither_raises_nor_leaves_the_mode():
    from torch.utils._python_dispatch import _len_torch_dispatch_stack
    base = _len_torch_dispatch_stack()
    rec = memlens.record(allocator="none")
    rec.__enter__()
    x = torch.ones(64) * 3
    errors = []

    def other():
        try:
            rec.__exit__(None, None, None)
        except BaseException as exc:  # noqa: BLE001 - the point is that nothing reaches user code
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert errors == []
    assert rec.trace is not None and 256 in set(rec.trace.blocks["size"].tolist())
    memlens.step()  # the owner thread's next memlens call pops the orphaned mode
    assert _len_torch_dispatch_stack() == base
    with memlens.record(allocator="none") as again:
        torch.ones(32) + 1
    assert again.trace is not None and 128 in set(again.trace.blocks["size"].tolist())
    assert _len_torch_dispatch_stack() == base
    del x


def test_record_size_option_is_validated():
    # `record` takes its size option through the shared validation layer
    outcome = run_memlens("record", "-o", "/tmp/never.memlens", "--max-buffer", "-5", "--", "python", "x.py")
    assert_refused(outcome, "--max-buffer")

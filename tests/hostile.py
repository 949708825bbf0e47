"""Run the memlens CLI in a child process and measure what it cost: exit code, stderr, peak RSS, seconds.

The hostile-input tests build their files at test time and check the hostile-input contract: exit code 2,
one stderr line without control characters, peak memory well under 1 GiB, no hang.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMORY_CEILING = 1 << 30  # bytes: the bound for any hostile input
TIME_CEILING_S = 30.0     # the bound; used as a hang guard (kill), not as a speed assertion


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    peak_rss: int  # bytes, of the child alone (os.wait4)
    seconds: float
    cpu_seconds: float = 0.0  # user + system CPU of the child (os.wait4): stable on a loaded machine


def run_memlens(*argv, env: dict | None = None, timeout: float = TIME_CEILING_S, cwd=None) -> Outcome:
    """`python -m memlens ARGV` in a fresh process with this checkout first on sys.path; peak RSS from
    the child's own rusage (os.wait4), so other tests' processes do not count."""
    return run_python(["-m", "memlens", *map(str, argv)], env=env, timeout=timeout, cwd=cwd)


def run_python(args: list, env: dict | None = None, timeout: float = TIME_CEILING_S, cwd=None) -> Outcome:
    """`python ARGS` in a child process, measured like `run_memlens`."""
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = str(ROOT) + os.pathsep + child_env.get("PYTHONPATH", "")
    child_env.update(env or {})
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, *map(str, args)], stdout=out, stderr=err, env=child_env,
                                cwd=cwd)
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        hwm = _HighWaterMark(proc.pid)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
            hwm.stop()
        seconds = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace")
    if seconds >= timeout:
        raise AssertionError(f"python {' '.join(map(str, args))} ran past {timeout} s (a hang)")
    # ru_maxrss of a child counts the high-water mark of the memory it was forked from (Linux records the
    # old mm's at exec): once this test process is large it would blame the child. The child's own mm
    # high-water mark (VmHWM, fresh after exec) is sampled instead; ru_maxrss is the fallback.
    peak = hwm.peak if hwm.peak else usage.ru_maxrss * 1024
    return Outcome(proc.returncode, stdout, stderr, peak, seconds, usage.ru_utime + usage.ru_stime)


class _HighWaterMark:
    """Samples /proc/PID/status VmHWM (bytes; monotonic over the life of the exec'd image) until stopped."""

    def __init__(self, pid: int, interval_s: float = 0.005):
        self.pid, self.interval_s, self.peak = pid, interval_s, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            with open(f"/proc/{self.pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"VmHWM:"):
                        self.peak = max(self.peak, int(line.split()[1]) * 1024)
                        return
        except (OSError, ValueError, IndexError):
            pass

    def _run(self) -> None:
        while not self._done.wait(self.interval_s):
            self._read()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def assert_refused(outcome: Outcome, *needles: str) -> str:
    """Exit 2, exactly one stderr line, no control characters, every needle in it, under the memory
    ceiling. Returns the line."""
    assert outcome.code == 2, (outcome.code, outcome.stderr[-2000:])
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1, outcome.stderr[-2000:]
    line = lines[0]
    assert "Traceback" not in line
    assert not any(unicodedata.category(ch) in ("Cc", "Cf") for ch in line), repr(line)
    for needle in needles:
        assert needle in line, (needle, line)
    assert outcome.peak_rss < MEMORY_CEILING, f"peak RSS {outcome.peak_rss / 2**20:.0f} MiB: {line}"
    return line

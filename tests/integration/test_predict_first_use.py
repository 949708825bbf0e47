"""The first memlens.predict after an install that built nothing ahead works in the same process: importing
torch after memlens builds the missing fake-CUDA shim (once) and loads it before torch initialises. The build
goes where ``MEMLENS_BUILD_DIR`` says, with memlens's other compiled parts. Compiles the shim: slow.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_first_prediction_in_a_fresh_build_dir_works_in_the_same_process(tmp_path):
    code = textwrap.dedent("""
        import memlens
        import torch
        def step():
            model = torch.nn.Linear(256, 128).cuda()
            model(torch.randn(8, 256, device="cuda")).sum().backward()
        p = memlens.predict(step, gpu="H100")
        from memlens.prediction import shim
        print("RESULT", p.peak_allocated, shim.library_path())
    """)
    build = tmp_path / "builds"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "MEMLENS_BUILD_DIR": str(build)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1].split()
    peak, library = int(line[1]), Path(line[2])
    # the shim was built in this process's run, under MEMLENS_BUILD_DIR, and said so once
    assert library.is_file() and build in library.parents
    assert proc.stderr.count("building its fake-CUDA shim") == 1
    # weight 128x256 and its gradient, fp32, at least
    assert peak >= 2 * 128 * 256 * 4

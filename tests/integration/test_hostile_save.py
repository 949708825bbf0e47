"""Issue 26 item 7: readers of a trace that is being re-saved see the old trace or the new one, never "no such
file", through every entry point (format detection then load, and the out-of-core engine's open), with the
atomic exchange and with the two-rename fallback."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from hostile import ROOT
from memlens.trace.read import load_trace
from memlens.trace.tracedir import save_trace
from memlens.trace import Trace

_LOOP = textwrap.dedent("""
    import sys
    import numpy as np, pandas as pd
    from memlens.trace import tracedir
    from memlens.trace import Trace
    from memlens.io import load
    from memlens.trace.tracedir import save_trace
    from memlens.analysis.outofcore.files import TraceFiles
    path, role, count, exchange = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if exchange == "off":
        tracedir._exchange = lambda a, b: False
    failures = 0
    for i in range(count):
        try:
            if role == "load":
                assert len(load(path).blocks) in (4, 6)
            elif role == "open":
                assert TraceFiles.open(path).rows["blocks"] in (4, 6)
            else:
                n = 4 if i % 2 else 6
                blocks = pd.DataFrame({"block_id": np.arange(n), "device": "cuda:0", "size": 512 + np.arange(n),
                                       "alloc_ns": np.arange(n), "free_ns": np.arange(n) + 1})
                save_trace(Trace.from_tables(blocks), path, overwrite=True)
        except Exception as exc:
            failures += 1
            print(type(exc).__name__, exc, file=sys.stderr)
    print(failures)
""")


@pytest.mark.parametrize("exchange", ["auto", "off"])
def test_readers_never_see_no_such_file_while_a_trace_is_resaved(tmp_path, exchange):
    blocks = pd.DataFrame({"block_id": np.arange(4), "device": "cuda:0", "size": 512 + np.arange(4),
                           "alloc_ns": np.arange(4), "free_ns": np.arange(4) + 1})
    path = save_trace(Trace.from_tables(blocks), tmp_path / "shared.memlens")
    script = tmp_path / "loop.py"
    script.write_text(_LOOP)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, str(script), str(path), role, str(count), exchange], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for role, count in (("save", 40), ("load", 80), ("open", 200))]
    results = [p.communicate(timeout=400) for p in procs]
    for (out, err), p in zip(results, procs):
        assert p.returncode == 0, err[-2000:]
        assert out.strip() == "0", err[-2000:]
    assert len(load_trace(path).blocks) in (4, 6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop.py", "shared.memlens"]

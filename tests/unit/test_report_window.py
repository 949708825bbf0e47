"""The report's window around the peak: a peak at the instant an iteration starts is in that iteration."""
from __future__ import annotations

import pandas as pd

from memlens.reporting.window import peak_window
from memlens.trace import Trace


def test_peak_at_an_iteration_start_is_in_the_iteration_it_starts():
    # iterations [0, 100) and [100, 200]; the 1 MB block allocated at exactly 100 makes the peak there
    # (iteration 0 overlaps 3 blocks, iteration 1 two: either fits max_blocks=3)
    blocks = pd.DataFrame({"block_id": [1, 2, 3, 4], "device": "cuda:0", "size": [10, 30, 1_000_000, 5],
                           "alloc_ns": [0, 20, 100, 185], "free_ns": [50, 40, 180, 200]})
    trace = Trace.from_tables(blocks)
    its = pd.DataFrame({"iteration": [0, 1], "start_ns": [0, 100], "end_ns": [100, 200], "source": "marker"})
    w = peak_window(trace, max_blocks=3, iterations=its)
    assert w.how.startswith("iteration 1,") and (w.start_ns, w.end_ns) == (100, 200)

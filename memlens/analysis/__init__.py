"""Analyses of a Trace: one module per question.

- `bandwidth`: host<->device transfer cost model (`BandwidthModel`, presets)
- `ati`: access time intervals per block and their statistics
- `distributions`: quantiles, log histograms, ECDFs, size classes
- `outliers`: the bandwidth filter (swappable intervals) and ranked idle blocks (size x idle, DOA/AOA/WDOA)
- `iterations`: iteration boundaries (markers, optimizer steps or the detected period)
- `period`: period detection and pattern matching on symbol sequences (FFT autocorrelation)
- `stability`: per-iteration statistics and how alike consecutive iterations are
- `live`: the live-bytes curve as arrays (per device or all devices)
- `peak`: what is live at the peak, per device
- `fragmentation`: reserved vs allocated vs requested bytes where the trace has allocator segments
- `findings`: the results stated in sentences with numbers
- `peak_story`: the peak story of `memlens info --json` (cause, top sites with source lines, iterations, phases)
"""


def __getattr__(name):
    """Submodules load on first attribute access, so that the names the README writes
    (`memlens.analysis.<module>.<object>`) work after a plain ``import memlens``."""
    import importlib
    import importlib.util
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

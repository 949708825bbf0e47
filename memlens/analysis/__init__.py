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


"""What-if simulation of device memory allocators on a recorded trace.

``simulate(trace, allocator="caching", conf="expandable_segments:True", capacity="80GB")`` replays the
trace's allocation requests through a faithful model of PyTorch's CUDACachingAllocator (or a baseline
allocator) and reports, per device, reserved and allocated bytes over time, peaks, segment reservations,
fragmentation and OOMs. ``compare(trace, {...})`` puts several configurations side by side.
"""
from memlens.simulate.compare import compare, compare_figure
from memlens.simulate.config import AllocatorConfig, parse_conf, round_size
from memlens.simulate.engine import ALLOCATORS, recorded_config, simulate
from memlens.simulate.result import DeviceResult, SimulationResult

__all__ = ["simulate", "compare", "compare_figure", "AllocatorConfig", "parse_conf", "round_size",
           "recorded_config", "SimulationResult", "DeviceResult", "ALLOCATORS"]

"""Swap planning: copy idle blocks to the host and prefetch them back, to lower the device's peak.

`plan_swaps(trace, bandwidth=..., limit=..., priority=...)` returns a `SwapPlan`; see `memlens.swap.planner`.
"""
from __future__ import annotations

from memlens.swap.planner import SwapPlan, infinite_bandwidth_peak, plan_swaps

__all__ = ["plan_swaps", "SwapPlan", "infinite_bandwidth_peak"]

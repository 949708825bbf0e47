"""`simulate()`: replay a trace's requests through an allocator model, device by device."""
from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np
import pandas as pd

from memlens.errors import InputError
from memlens.simulate.baselines import BASELINES
from memlens.simulate.blocks import AddressSpace
from memlens.simulate.caching import CachingAllocator
from memlens.simulate.config import AllocatorConfig, parse_conf
from memlens.simulate.replay import (
    ALLOC, EMPTY_CACHE, FAILED_REQUEST, FREE, FREE_COMPLETED, FREE_REQUESTED, RELEASE_BEFORE_RESERVE,
    DeviceRequests, device_requests,
)
from memlens.simulate.result import DeviceResult, SimulationResult
from memlens.simulate.state import blocks_table, install_expandable, install_segment

ALLOCATORS = ("caching",) + tuple(BASELINES)
INITIAL_STATES = ("auto", "warm", "empty")


def recorded_config(trace) -> AllocatorConfig | None:
    """The allocator settings stored in the trace (a snapshot's ``allocator_settings``), if any."""
    settings = trace.metadata.get("allocator_settings")
    if not settings:
        return None
    return parse_conf(settings, where="trace allocator_settings")


def _trace_devices(trace) -> list[str]:
    devices = set(trace.blocks["device"].unique().tolist())
    for table in (trace.events, trace.segments):
        if table is not None and len(table):
            devices.update(table["device"].unique().tolist())
    return sorted(devices)


UNLIMITED_WORDS = ("unlimited", "none", "inf")


def _parse_capacity(capacity) -> int | None:
    if capacity is None or (isinstance(capacity, str) and capacity.strip().lower() in UNLIMITED_WORDS):
        return None
    from memlens.units import parse_bytes
    value = parse_bytes(capacity)
    if value <= 0:
        raise InputError(f"capacity must be positive, got '{capacity}'")
    return value


def _run(alloc, req: DeviceRequests) -> tuple[list[int], ...]:
    """The replay loop: one step per request; returns reserved / allocated / inactive-split bytes after
    each, and the address each request got (-1: not an allocation, or an OOM)."""
    reserved, allocated, inactive, addrs = [], [], [], []
    res_add, all_add, ina_add, addr_add = reserved.append, allocated.append, inactive.append, addrs.append
    returns_block = isinstance(alloc, CachingAllocator)
    # a recorded release before a reservation may be the OOM retry of a full device; with a capacity the
    # simulated OOM path decides instead (see memlens.simulate.replay)
    release_kinds = (EMPTY_CACHE,) if alloc.capacity is not None else (EMPTY_CACHE, RELEASE_BEFORE_RESERVE)
    malloc, free, free_req, free_done = alloc.malloc, alloc.free, alloc.free_requested, alloc.free_completed
    for kind, block_id, size, stream, t_ns, seq in zip(req.kind.tolist(), req.block_id.tolist(),
                                                       req.size.tolist(), req.stream.tolist(),
                                                       req.t_ns.tolist(), req.seq.tolist()):
        if kind == ALLOC:
            alloc.seq = seq  # stamps the segment events and OOMs this request may cause
            alloc.t_ns = t_ns
            got = malloc(block_id, size, stream)
            addr_add(-1 if got is None else (got.addr if returns_block else got))
        else:
            if not returns_block:  # baselines release device memory on frees
                alloc.seq = seq
                alloc.t_ns = t_ns
            if kind == FREE:
                free(block_id)
            elif kind == FREE_REQUESTED:
                free_req(block_id)
            elif kind == FREE_COMPLETED:
                free_done(block_id)
            elif kind in release_kinds:
                alloc.seq = seq
                alloc.t_ns = t_ns
                alloc.empty_cache()
            elif kind == FAILED_REQUEST:  # the recording's OOM: would it fit here? (freed at once)
                alloc.seq = seq
                alloc.t_ns = t_ns
                if malloc(block_id, size, stream) is not None:
                    free(block_id)
            addr_add(-1)
        res_add(alloc.reserved)
        all_add(alloc.allocated)
        ina_add(alloc.inactive_split)
    return reserved, allocated, inactive, addrs


def simulate_device(req: DeviceRequests, allocator: str, config: AllocatorConfig, capacity: int | None,
                    warm: bool) -> DeviceResult:
    """Replay one device's requests (see `simulate`)."""
    notes = list(req.notes)
    if allocator == "caching":
        alloc = CachingAllocator(config, capacity, AddressSpace(req.address_hints))
    else:
        alloc = BASELINES[allocator](capacity)
    first_t = int(req.t_ns[0]) if len(req) else 0
    alloc.seq, alloc.t_ns = -1, first_t
    if warm:
        virtual: dict[int, list] = {}
        for seg in req.warm_segments:
            if seg.expandable_base is None:
                install_segment(alloc, seg.addr, seg.size, seg.is_small, seg.stream, seg.live)
            else:
                virtual.setdefault(seg.expandable_base, []).append(seg)
        for base, runs in virtual.items():
            first = runs[0]
            install_expandable(alloc, base, first.page, first.is_small, first.stream,
                               [(r.addr, r.size, r.live) for r in runs])
    else:  # blocks live before recording are requested first, in address order
        for r in req.live_at_start.itertuples(index=False):
            alloc.malloc(int(r.block_id), int(r.size), int(r.stream))
            if r.pending:
                alloc.free_requested(int(r.block_id))
        if len(req.live_at_start):
            notes.append(f"started empty: {len(req.live_at_start)} block(s) live before recording were "
                         "allocated first")
    start = (alloc.reserved, alloc.allocated, alloc.inactive_split)
    reserved, allocated, inactive, addrs = _run(alloc, req)
    timeline = pd.DataFrame({
        "t_ns": np.concatenate([[first_t], req.t_ns]).astype(np.int64),
        "seq": np.concatenate([[-1], req.seq]).astype(np.int64),
        "reserved": np.array([start[0]] + reserved, dtype=np.int64),
        "allocated": np.array([start[1]] + allocated, dtype=np.int64),
        "inactive_split_bytes": np.array([start[2]] + inactive, dtype=np.int64),
        "addr": np.array([-1] + addrs, dtype=np.int64),
    })
    timeline["fragmentation"] = timeline["reserved"] - timeline["allocated"]
    seg_ev = pd.DataFrame(alloc.segment_events, columns=["seq", "t_ns", "action", "addr", "size"])
    recorded = None
    if req.recorded is not None:
        r = req.recorded
        recorded = {"initial_reserved": r.initial_reserved, "peak_reserved": r.peak_reserved,
                    "final_reserved": r.final_reserved, "segment_allocs": r.segment_allocs,
                    "oom_capacity": r.oom_capacity}
    conf = config.to_conf_string() if allocator == "caching" else ""
    final = pd.DataFrame(blocks_table(alloc)) if isinstance(alloc, CachingAllocator) else None
    return DeviceResult(req.device, allocator, conf, timeline, seg_ev, alloc.ooms,
                        "warm" if warm else "empty", recorded, notes, final, capacity)


def simulate(trace, allocator: str = "caching", conf: str | Mapping[str, Any] | AllocatorConfig | None = None,
             capacity: int | str | None = None, device: str | None = None,
             initial_state: str = "auto") -> SimulationResult:
    """Simulate an allocator on a trace's requests and report what it reserves, per device.

    - `trace`: a `memlens.Trace` or a path any importer reads.
    - `allocator`: ``"caching"`` (PyTorch's CUDACachingAllocator), ``"malloc"`` (no caching),
      ``"bestfit"`` (one best-fit heap) or ``"bump"`` (an arena).
    - `conf`: caching-allocator settings as a ``PYTORCH_CUDA_ALLOC_CONF`` string or dict; default: the
      trace's recorded ``allocator_settings`` (torch's defaults when it has none).
    - `capacity`: bytes (or "80GB") the allocator may reserve; past it the OOM path runs and failures are
      reported in ``ooms``. None: inferred from the recording's OOM entries when it has some (reserved
      bytes at the OOM + the device's free bytes), else unlimited; ``"unlimited"``: never limited.
    - `device`: simulate only this device (default: all).
    - `initial_state`: ``"warm"`` starts from the allocator state rebuilt from the recording (its initial
      segments and the blocks live in them), ``"empty"`` from an empty allocator with the blocks live before
      recording requested first, ``"auto"`` is warm for the caching allocator under the recorded settings
      when the trace has final segments, else empty.
    """
    if isinstance(trace, (str, os.PathLike)):
        from memlens.io import load
        trace = load(trace)
    if allocator not in ALLOCATORS:
        raise InputError(f"unknown allocator '{allocator}' (choose from {', '.join(ALLOCATORS)})")
    if initial_state not in INITIAL_STATES:
        raise InputError(f"unknown initial_state '{initial_state}' (choose from {', '.join(INITIAL_STATES)})")
    recorded = recorded_config(trace)
    config = parse_conf(conf) if conf is not None else (recorded or AllocatorConfig())
    cap = _parse_capacity(capacity)
    infer_capacity = capacity is None  # "unlimited" turns the inference from recorded OOMs off
    devices = _trace_devices(trace)
    if device is not None:
        if device not in devices:
            raise InputError(f"device '{device}' is not in the trace (devices: {', '.join(devices) or 'none'})")
        devices = [device]
    has_final_state = trace.segments is not None and len(trace.segments) > 0
    results = {}
    for dev in devices:
        req = device_requests(trace, dev, recorded or config)
        if initial_state == "warm":
            if allocator != "caching":
                raise InputError("initial_state='warm' needs the caching allocator (its segments)")
            warm = True
        elif initial_state == "empty":
            warm = False
        else:
            same_policy = recorded is None or config == recorded
            warm = allocator == "caching" and has_final_state and same_policy
        dev_cap = cap
        if infer_capacity and req.recorded is not None and req.recorded.oom_capacity is not None:
            dev_cap = req.recorded.oom_capacity
            req.notes.append(f"capacity {dev_cap:,} bytes inferred from the recorded OOM (reserved bytes "
                             "then + the device's free bytes); pass capacity='unlimited' to lift it")
        results[dev] = simulate_device(req, allocator, config, dev_cap, warm)
    return SimulationResult(allocator, config.to_conf_string() if allocator == "caching" else "", cap, results)
